"""docs/api.md is what the code's field docs and docstrings say now."""

from fastpath.runtime import api_reference


def test_docs_api_md_is_up_to_date():
    assert api_reference.main(["--check"]) == 0, f"regenerate with: {api_reference.REGENERATE}"


def test_every_sampling_param_and_engine_option_is_documented():
    import dataclasses

    from fastpath.runtime.engine.options import EngineOptions
    from fastpath.runtime.engine.outputs import CompletionOutput, RequestOutput
    from fastpath.runtime.engine.sampling_params import SamplingParams

    for cls in (SamplingParams, EngineOptions, RequestOutput, CompletionOutput):
        missing = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("doc")]
        assert missing == [], f"{cls.__name__} fields without a doc: {missing}"
