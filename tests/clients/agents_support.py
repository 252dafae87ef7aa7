"""Shared data of the agent plug-in tests."""

CORPUS = [
    {"doc_id": f"d{i:02d}", "title": title, "text": text}
    for i, (title, text) in enumerate(
        [
            ("Velmoria", "Ostrava is the capital of Velmoria and has a population of 1.2 million."),
            ("France", "Paris is the capital of France, with a population of 2.1 million."),
            ("Anna Berg", "Anna Berg is a singer born in Velmoria."),
            ("Zandor", "The capital of Zandor, Quell, counts 300,000 inhabitants."),
            ("Capitals", "Population statistics for capitals in Europe vary widely."),
            ("Velmoria history", "Velmoria is a small country with an old capital."),
            ("Quell", "Quell lies on a river; its population grew after the war."),
            ("Ostrava", "Ostrava has a large population and a steel industry."),
            ("Singers", "Many singers were born in small capital cities."),
            ("Rivers", "Rivers of Zandor flow north to the sea."),
            ("Census", "A census counts the population of a country and of its capital."),
            ("Berg family", "The Berg family lived in Ostrava for a century."),
            ("Music", "Velmorian music is famous for its singers."),
            ("Trade", "Trade between Zandor and Velmoria grew in the capital markets."),
            ("Geography", "The geography of Velmoria includes mountains and lakes."),
            ("Population", "Population growth in Europe slowed down."),
        ]
    )
]
