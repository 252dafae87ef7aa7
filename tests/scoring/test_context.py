import pytest

from acare_ray.scoring import AgentContext, FieldDropout, Mode, parse_mode


def test_auto_mode_is_the_richest_the_fields_allow():
    assert AgentContext("q").richest_mode is Mode.M0
    assert AgentContext("q", reasoning="r").richest_mode is Mode.M1
    assert AgentContext("q", question="Q").richest_mode is Mode.M2
    assert AgentContext("q", question="Q", reasoning="r").resolve_mode("auto") is Mode.M3


def test_whitespace_only_fields_are_absent():
    context = AgentContext("q", question="   \n", reasoning="")
    assert context.question is None and context.reasoning is None
    assert context.resolve_mode() is Mode.M0


@pytest.mark.parametrize(
    ("mode", "field"), [("M1", "reasoning"), ("M2", "question"), ("full", "question")]
)
def test_forced_mode_with_missing_field_names_the_field(mode, field):
    with pytest.raises(ValueError, match=field):
        AgentContext("q").resolve_mode(mode)


def test_aliases_and_case_insensitive_names():
    assert parse_mode("base") is Mode.M0
    assert parse_mode("reasoning") is Mode.M1
    assert parse_mode("question") is Mode.M2
    assert parse_mode("FULL") is Mode.M3
    assert parse_mode("m2") is Mode.M2
    assert parse_mode("Auto") == "auto"
    with pytest.raises(ValueError, match="M5"):
        parse_mode("M5")


def test_forced_smaller_mode_drops_the_extra_fields():
    context = AgentContext("q", question="Q", reasoning="r")
    assert context.for_mode(Mode.M0) == AgentContext("q")
    assert context.for_mode(Mode.M1) == AgentContext("q", reasoning="r")


@pytest.mark.parametrize("sub_query", ["", "  ", None])
def test_sub_query_is_required(sub_query):
    with pytest.raises(ValueError, match="sub_query"):
        AgentContext(sub_query)


def test_dropout_gives_each_mode_a_quarter_and_repeats():
    dropout = FieldDropout(seed=7)
    full = AgentContext("q", question="Q", reasoning="r")
    modes = [dropout.apply(full, f"g{i}", epoch=0).richest_mode for i in range(2000)]
    for mode in Mode:
        assert abs(modes.count(mode) / 2000 - 0.25) < 0.03, mode
    again = [dropout.apply(full, f"g{i}", epoch=0).richest_mode for i in range(2000)]
    assert modes == again
    next_epoch = [dropout.apply(full, f"g{i}", epoch=1).richest_mode for i in range(2000)]
    assert modes != next_epoch


def test_dropout_draws_fields_independently():
    dropout = FieldDropout(seed=1)
    keeps = [
        (dropout.keeps("question", f"g{i}", 0), dropout.keeps("reasoning", f"g{i}", 0))
        for i in range(4000)
    ]
    both = sum(q and r for q, r in keeps) / 4000
    assert abs(both - 0.25) < 0.03


def test_refused_inputs_name_their_field_in_attributes_not_only_in_text():
    import pytest

    from acare_ray.scoring import AgentContext, FieldError, Mode, check_documents

    with pytest.raises(FieldError) as caught:
        AgentContext("   ")
    assert (caught.value.field, caught.value.index) == ("sub_query", None)
    assert str(caught.value) == "sub_query is missing or empty"
    with pytest.raises(FieldError) as caught:
        AgentContext("q", question="why").resolve_mode(Mode.M3)
    assert caught.value.field == "reasoning" and "needs the field 'reasoning'" in str(caught.value)
    with pytest.raises(FieldError) as caught:
        check_documents(["fine", "also fine", " "])
    assert (caught.value.field, caught.value.index, caught.value.detail) == (
        "documents",
        2,
        "is empty",
    )
    assert str(caught.value) == "documents[2] is empty"
    assert isinstance(caught.value, ValueError)  # callers catching ValueError still do


def test_a_field_error_survives_pickling_with_its_fields():
    """Ray ships a worker's error to the driver by pickling it."""
    import pickle

    from acare_ray.scoring.context import FieldError

    err = pickle.loads(pickle.dumps(FieldError("documents", "is empty", 3)))
    assert (err.field, err.detail, err.index, str(err)) == (
        "documents",
        "is empty",
        3,
        "documents[3] is empty",
    )
