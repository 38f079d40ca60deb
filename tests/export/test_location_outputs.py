"""Named locations (zoo/hooks.py) as extra outputs of an exported block, checked against eager."""

from __future__ import annotations

import pytest

import zoo
from export.choice import why_not
from export.errors import ExportError
from export.writer import export_onnx
from parity.matrix import SHAPES, check

# one export in the default run; the rest (every location, each traced lowering) with -m slow
CASES = [
    ("gqa", "decomposed", ("y", "pattern", "z")),
    pytest.param("mha-causal", "decomposed", ("y", "q", "k", "v", "scores", "result"), marks=pytest.mark.slow),
    pytest.param("cross-attention", "onnx-attention", ("y", "z", "q", "result"), marks=pytest.mark.slow),
    pytest.param("gqa", "ort-mha", ("y", "z"), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, lowering, outputs", CASES)
def test_locations_as_outputs_match_eager(name, lowering, outputs, tmp_path):
    row = check(name, lowering, case="masked", outputs=outputs, shapes=SHAPES[2:4], workdir=tmp_path)
    assert row.status == "PASS", row.reason


def test_a_fused_lowering_says_why_not(tmp_path):
    spec = zoo.spec("gqa")
    reason = why_not("onnx-attention", spec, locations=("y", "pattern")[1:])
    assert "does not output the softmax weights" in reason and "pattern" in reason
    assert "no named location" in why_not("ort-gqa", spec, locations=("z",))
    assert why_not("decomposed", spec, locations=("pattern", "z")) is None
    row = check("gqa", "ort-gqa", outputs=("y", "z"), workdir=tmp_path)
    assert row.status == "SKIP" and "no named location" in row.reason
    with pytest.raises(ExportError, match="cannot express this request"):
        export_onnx("gqa", tmp_path / "a.onnx", lowering="onnx-attention", outputs=("y", "pattern"))
    with pytest.raises(ExportError, match="not a location"):
        export_onnx("gqa", tmp_path / "a.onnx", outputs=("y", "attn"))
    with pytest.raises(zoo.InputTypeError, match="starting with 'y'"):
        export_onnx("gqa", tmp_path / "a.onnx", outputs=("z",))
    with pytest.raises(ExportError, match="decode model"):
        export_onnx("gqa", tmp_path / "a.onnx", decode=True, outputs=("y", "z"))
