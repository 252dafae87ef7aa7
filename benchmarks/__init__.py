"""Speed, scale and quality measurements of acare_ray, run from the repository root as
``python -m benchmarks.<name>`` (see benchmarks/README.md). Not part of the installed package."""
