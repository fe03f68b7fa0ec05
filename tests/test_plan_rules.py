"""The quantize dispatch as data (``nqdq.gpu.quantize.rules``): its docstring's table names the
rules of ``RULES`` in order, one case of each rule plans by it (in the simulator: plans only,
nothing runs), and a kernel design is selected by ``choices=`` (``KernelChoices``), part of
the plan cache key, with the case's plain fallback where the design cannot run it."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize import rules
from nqdq.gpu.quantize.choices import KernelChoices, PerChannel, PerTensor
from nqdq.gpu.runtime.target import SIMULATOR
from nqdq.schemes import resolve_scheme

BF16 = ml_dtypes.bfloat16
KINDS = {np.float32: 0, BF16: 1, np.float16: 2}


def _table_rules(doc):
    """The first-column words of the docstring's rule table (rows of the RST simple table
    between its second and third rule lines; continuation lines have an empty first column)."""
    lines = doc.splitlines()
    borders = [i for i, ln in enumerate(lines) if ln.startswith("====")]
    assert len(borders) == 3, "the module docstring has one table with a header"
    body = lines[borders[1] + 1 : borders[2]]
    return [ln.split()[0] for ln in body if ln and not ln[0].isspace()]


def test_docstring_table_is_the_rule_table():
    assert _table_rules(rules.__doc__) == [r.name for r in rules.RULES]


def test_every_design_is_in_the_table():
    """Each named design of choices.py appears in the table at the rule that takes it."""
    for design in [*PerChannel, *PerTensor]:
        assert f"{type(design).__name__}.{design.name}" in rules.__doc__, design


# (scheme name, scheme kw, shape, dtype, get_plan kw) -> the rule that plans it in the simulator
# (one SM: the one-launch grid takes only small inputs; clusters of one block)
CASES = [
    ("fp8_tensor", {"static_scale": True}, (3, 64), BF16, {"static_scale": True}, "static_units"),
    ("nvfp4", {}, (3, 64), BF16, {"static_scale": True}, "nvfp4_given_scale_units"),
    ("nvfp4", {}, (3, 20), BF16, {"static_scale": True}, "nvfp4_given_scale"),
    ("e4m3", {"granularity": "row", "axis": 0, "static_scale": True}, (8, 64), np.float32, {"static_scale": True},
     "static"),
    ("nvfp4", {}, (4, 64), BF16, {}, "nvfp4_one_launch"),
    ("nvfp4", {}, (64, 1024), BF16, {}, "nvfp4_amax_in_groups"),
    ("nvfp4", {}, (16384, 1024), BF16, {}, "nvfp4_two_pass_units"),  # 2^21 units: NVFP4_SENC_MAX_UNITS
    ("nvfp4", {}, (3, 20), BF16, {}, "nvfp4_general"),
    ("fp8_tensor", {}, (4, 64), BF16, {}, "tensor_one_launch"),
    ("fp8_tensor", {}, (64, 1024), BF16, {}, "tensor_resident"),
    ("fp8_tensor", {}, (64, 1024), BF16, {"stoch": True}, "tensor_two_pass_units"),
    ("fp8_tensor", {}, (3, 70), BF16, {}, "tensor_general"),
    ("fp8_128x128", {"block_shape": (4, 16)}, (2, 9, 64), np.float32, {}, "tile_blocks"),
    ("fp8_128x128", {"block_shape": (4, 16)}, (2, 9, 64), np.float32, {"stoch": True}, "tile_general"),
    ("int8_column", {}, (13, 256), BF16, {}, "column_cluster"),
    ("int8_column", {}, (13, 256), BF16, {"choices": KernelChoices(per_channel=PerChannel.RING)}, "column_ring"),
    ("int8_column", {}, (4, 256), BF16, {}, "column_single_chunk"),  # rows a block holds: no cluster
    ("int8_column", {}, (300, 64), BF16, {}, "column_two_pass"),
    ("int8", {"granularity": "column", "axis": 0}, (4, 64), BF16, {}, "column_rows"),
    ("int8", {"granularity": "column", "symmetric": False}, (4, 64), BF16, {}, "column_general"),
    ("fp8_row", {}, (3, 64), BF16, {}, "lastaxis_units"),
    ("mxfp8", {}, (3, 80), BF16, {}, "lastaxis_groups"),  # a partial last group
    ("e4m3", {"granularity": "row", "axis": 0}, (8, 64), np.float32, {}, "strided"),
]


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's geometry (one SM)")
@pytest.mark.parametrize("name, kw, shape, dtype, plan_kw, rule", CASES, ids=[c[-1] for c in CASES])
def test_each_rule_plans_its_case(name, kw, shape, dtype, plan_kw, rule):
    plan = kq.get_plan(shape, KINDS[dtype], resolve_scheme(name, **kw), **plan_kw)
    assert plan.rule == rule


def test_the_cases_cover_every_rule():
    assert [c[-1] for c in CASES] == [r.name for r in rules.RULES]


def _rule(shape, dtype, name, choices=None, **kw):
    return kq.get_plan(shape, KINDS[dtype], resolve_scheme(name), choices=choices, **kw).rule


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's geometry (one SM)")
@pytest.mark.parametrize(
    "name, shape, kw, choices, rule",
    [
        # a design runs where the case allows it ...
        ("int8_column", (13, 256), {}, KernelChoices(per_channel="two_pass"), "column_two_pass"),
        ("int8_column", (13, 256), {}, KernelChoices(per_channel="single_chunk"), "column_single_chunk"),
        ("fp8_tensor", (4, 64), {}, KernelChoices(per_tensor="resident"), "tensor_resident"),
        ("fp8_tensor", (4, 64), {}, KernelChoices(per_tensor="two_pass"), "tensor_two_pass_units"),
        ("nvfp4", (4, 64), {}, KernelChoices(per_tensor="amax_in_groups"), "nvfp4_amax_in_groups"),
        ("nvfp4", (4, 64), {}, KernelChoices(per_tensor="two_pass"), "nvfp4_two_pass_units"),
        ("nvfp4", (16384, 1024), {}, KernelChoices(per_tensor="amax_in_groups"), "nvfp4_amax_in_groups"),
        # ... and elsewhere the case's plain fallback, never another named design
        ("int8_column", (4, 256), {}, KernelChoices(per_channel="cluster"), "column_two_pass"),  # rows of one block
        ("int8_column", (300, 64), {}, KernelChoices(per_channel="single_chunk"), "column_two_pass"),
        ("fp8_tensor", (64, 1024), {}, KernelChoices(per_tensor="one_launch"), "tensor_two_pass_units"),
        ("fp8_tensor", (64, 1024), {"stoch": True}, KernelChoices(per_tensor="resident"), "tensor_two_pass_units"),
        ("fp8_tensor", (4, 64), {}, KernelChoices(per_tensor="amax_in_groups"), "tensor_two_pass_units"),
        ("nvfp4", (4, 64), {}, KernelChoices(per_tensor="resident"), "nvfp4_two_pass_units"),
        # a choice of one kind leaves the other automatic
        ("fp8_tensor", (4, 64), {}, KernelChoices(per_channel="ring"), "tensor_one_launch"),
    ],
)
def test_choices_select_a_design(name, shape, kw, choices, rule):
    assert _rule(shape, BF16, name, choices, **kw) == rule


def test_choices_are_part_of_the_plan_key():
    sch = resolve_scheme("int8_column")
    auto = kq.get_plan((13, 256), 1, sch)
    assert kq.get_plan((13, 256), 1, sch, choices=KernelChoices()) is auto
    ring = kq.get_plan((13, 256), 1, sch, choices=KernelChoices(per_channel=PerChannel.RING))
    assert ring is not auto and ring is kq.get_plan((13, 256), 1, sch, choices=KernelChoices(per_channel="ring"))
    assert ring._build_args[-2] == KernelChoices(per_channel=PerChannel.RING)  # (its refusal fallback keeps it)


def test_choices_by_value_and_errors():
    assert KernelChoices(per_channel="ring", per_tensor="one_launch") == KernelChoices(PerChannel.RING,
                                                                                       PerTensor.ONE_LAUNCH)
    with pytest.raises(ValueError):
        KernelChoices(per_channel="registers")
    c = KernelChoices(per_tensor=PerTensor.RESIDENT)
    assert c.allows(PerChannel.CLUSTER) and c.allows(PerTensor.RESIDENT) and not c.allows(PerTensor.ONE_LAUNCH)
