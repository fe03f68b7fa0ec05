"""LLVM IR (text) of a block-scaled GEMM for gfx950 -- assembled for gfx950, not run.

``C[M, N] = dequant(A[M, K]) @ dequant(B[N, K]).T`` in float32, with A and B packed codes
(row-major, ``reference/packing.py``: one byte per fp8 code, four fp6 codes in three bytes,
two fp4 codes a byte) and e8m0 scales per 32 of K. One workgroup of one wavefront (64
lanes) computes one 32 x 32 tile of C: workgroup id x is the tile column (N / 32), id y the
tile row (M / 32). Per K step of 64 each lane loads the bytes its registers hold
(:func:`.operands.lane_load_chunks`) and its scale, and issues one
``llvm.amdgcn.mfma.scale.f32.32x32x64.f8f6f4``; at the end it stores its 16 accumulators
(:func:`.operands.accumulator_coords`). No LDS, no bounds checks: M, N must be multiples
of 32 and K of 64 (:func:`.gemm_twin.check_gemm_shape`, which a launcher must call).

Scale layouts (``SCALE_LAYOUTS``):

``cdna4_32`` (nqdq's ``reference.layouts.CDNA4(32)``, the default)
    lane ``l`` loads the 32-bit word at byte ``((tile * ceil(K / 256) + s // 4) * 256 + 4 l)``
    of the stored ``[ceil(rows / 32), ceil(K / 32 / 8) * 8 * 32]`` array once per four K
    steps and passes byte ``s % 4`` of it to step ``s`` through ``opsel`` (an immediate, so
    the K loop is unrolled by four, with a tail of up to three steps).
``linear``
    lane ``l`` loads byte ``row * (K / 32) + 2 s + l // 32`` of the ``[rows, K / 32]``
    scales (``row`` = tile row + l % 32) every step, ``opsel = 0``.

The same index math, run in NumPy, is :func:`.gemm_twin.gemm_twin`.
"""

from __future__ import annotations

from .operands import K_STEP, TILE, MfmaOperand, lane_load_chunks, operand

__all__ = ["gemm_ir", "kernel_name", "mfma_intrinsic", "SCALE_LAYOUTS", "STEPS_PER_SCALE_WORD"]

SCALE_LAYOUTS = ("cdna4_32", "linear")
STEPS_PER_SCALE_WORD = {"cdna4_32": 4, "linear": 1}  # K steps unrolled per loop iteration


def kernel_name(fmt_a, fmt_b, scale_layout="cdna4_32") -> str:
    return f"nqdq_mx_gemm_{operand(fmt_a).fmt.name}_{operand(fmt_b).fmt.name}_{scale_layout}"


def mfma_intrinsic(op_a: MfmaOperand, op_b: MfmaOperand) -> str:
    return f"llvm.amdgcn.mfma.scale.f32.32x32x64.f8f6f4.v{op_a.regs}i32.v{op_b.regs}i32"


class _Emitter:
    def __init__(self):
        self.lines: list[str] = []
        self.n = 0

    def tmp(self, stem="t"):
        self.n += 1
        return f"%{stem}{self.n}"

    def __call__(self, text, stem="t"):
        """Emit ``%x = text`` and return ``%x``."""
        name = self.tmp(stem)
        self.lines.append(f"  {name} = {text}")
        return name

    def raw(self, text):
        self.lines.append(text)


def _row_bytes(e: _Emitter, op: MfmaOperand, k64: str) -> str:
    """i64 bytes of one packed row: K * bits / 8."""
    if op.bits == 8:
        return k64
    bits = e(f"mul i64 {k64}, {op.bits}")
    return e(f"lshr i64 {bits}, 3")


def _load_operand(e: _Emitter, op: MfmaOperand, lane_row_ptr: str, step: str, stem: str) -> str:
    """The ``<regs x i32>`` operand of K step ``step`` (i64) for this lane."""
    base = e(f"mul i64 {step}, {op.step_bytes}")
    parts = []
    for offset, nbytes in lane_load_chunks(op, 0):  # the half's offset is in lane_row_ptr
        off = e(f"add i64 {base}, {offset}")
        ptr = e(f"getelementptr inbounds i8, ptr addrspace(1) {lane_row_ptr}, i64 {off}")
        words = nbytes // 4
        align = 16 if nbytes % 16 == 0 else 8
        parts.append((e(f"load <{words} x i32>, ptr addrspace(1) {ptr}, align {align}", stem), words))
    if len(parts) == 1:
        return parts[0][0]
    (lo, n0), (hi, n1) = parts
    mask = ", ".join(f"i32 {i}" for i in range(n0 + n1))
    return e(f"shufflevector <{n0} x i32> {lo}, <{n1} x i32> {hi}, <{n0 + n1} x i32> <{mask}>", stem)


def gemm_ir(fmt_a, fmt_b, scale_layout: str = "cdna4_32") -> str:
    """The LLVM IR module (text) of the kernel ``kernel_name(fmt_a, fmt_b, scale_layout)``:

    ``void @name(ptr addrspace(1) a, b, scale_a, scale_b, c, i32 M, i32 N, i32 K)``, launched
    with grid (N / 32, M / 32) of 64-lane workgroups. ``fmt_a`` / ``fmt_b``: "e4m3",
    "e5m2", "e2m3", "e3m2", "e2m1" (mixed pairs allowed).
    """
    op_a, op_b = operand(fmt_a), operand(fmt_b)
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout={scale_layout!r} is not one of {SCALE_LAYOUTS}")
    unroll = STEPS_PER_SCALE_WORD[scale_layout]
    name = kernel_name(op_a, op_b, scale_layout)
    mfma = mfma_intrinsic(op_a, op_b)
    ta, tb = f"<{op_a.regs} x i32>", f"<{op_b.regs} x i32>"
    e = _Emitter()
    P = "ptr addrspace(1)"

    # --- entry: lane, tile, row pointers -------------------------------------------------
    e.raw("entry:")
    lane = e("call i32 @llvm.amdgcn.workitem.id.x()", "lane")
    tn = e("call i32 @llvm.amdgcn.workgroup.id.x()", "tn")
    tm = e("call i32 @llvm.amdgcn.workgroup.id.y()", "tm")
    r = e(f"and i32 {lane}, 31", "r")
    h = e(f"lshr i32 {lane}, 5", "h")
    k64 = e("zext i32 %K to i64", "k")
    n64 = e("zext i32 %N to i64", "n")
    h64 = e(f"zext i32 {h} to i64")
    lane64 = e(f"zext i32 {lane} to i64")
    rows = {}
    for who, tile, op, ptr in (("a", tm, op_a, "%a"), ("b", tn, op_b, "%b")):
        tile32 = e(f"shl i32 {tile}, 5")
        row = e(f"add i32 {tile32}, {r}", f"row_{who}")
        row64 = e(f"zext i32 {row} to i64")
        half_off = e(f"mul i64 {h64}, {lane_load_chunks(op, 1)[0][0]}")
        row_bytes = _row_bytes(e, op, k64)
        row_off = e(f"mul i64 {row64}, {row_bytes}")
        off = e(f"add i64 {row_off}, {half_off}")
        rows[who] = (e(f"getelementptr inbounds i8, {P} {ptr}, i64 {off}", f"{who}_lane"), row64, tile)
    nsteps = e(f"lshr i32 %K, 6", "nsteps")
    scale_ptrs = {}
    if scale_layout == "cdna4_32":
        k255 = e(f"add i64 {k64}, 255")
        chunks = e(f"lshr i64 {k255}, 8", "chunks")  # 256-byte chunks per 32 rows
        for who, sp in (("a", "%scale_a"), ("b", "%scale_b")):
            tile64 = e(f"zext i32 {rows[who][2]} to i64")
            first = e(f"mul i64 {tile64}, {chunks}")
            first_byte = e(f"shl i64 {first}, 8")
            lane_byte = e(f"shl i64 {lane64}, 2")
            base = e(f"add i64 {first_byte}, {lane_byte}")
            scale_ptrs[who] = e(f"getelementptr inbounds i8, {P} {sp}, i64 {base}", f"s{who}_lane")
        ngroups = e(f"lshr i32 %K, 8", "ngroups")
    else:
        kb = e(f"lshr i64 {k64}, 5", "kblocks")
        for who, sp in (("a", "%scale_a"), ("b", "%scale_b")):
            row_first = e(f"mul i64 {rows[who][1]}, {kb}")
            base = e(f"add i64 {row_first}, {h64}")
            scale_ptrs[who] = e(f"getelementptr inbounds i8, {P} {sp}, i64 {base}", f"s{who}_lane")
        ngroups = nsteps
    skip = e(f"icmp eq i32 {ngroups}, 0")
    e.raw(f"  br i1 {skip}, label %tail, label %loop")

    def scale_word(who, group64):
        if scale_layout == "cdna4_32":
            off = e(f"shl i64 {group64}, 8")
            ptr = e(f"getelementptr inbounds i8, {P} {scale_ptrs[who]}, i64 {off}")
            return e(f"load i32, {P} {ptr}, align 4", f"s{who}")
        off = e(f"shl i64 {group64}, 1")
        ptr = e(f"getelementptr inbounds i8, {P} {scale_ptrs[who]}, i64 {off}")
        byte = e(f"load i8, {P} {ptr}, align 1")
        return e(f"zext i8 {byte} to i32", f"s{who}")

    def step(acc, step64, sa, sb, opsel):
        a = _load_operand(e, op_a, rows["a"][0], step64, "opa")
        b = _load_operand(e, op_b, rows["b"][0], step64, "opb")
        return e(
            f"call <16 x float> @{mfma}({ta} {a}, {tb} {b}, <16 x float> {acc}, i32 {op_a.code}, "
            f"i32 {op_b.code}, i32 {opsel}, i32 {sa}, i32 {opsel}, i32 {sb})", "acc")

    # --- main loop: `unroll` K steps per scale word ---------------------------------------
    e.raw("loop:")
    g = e.tmp("g")
    acc_in = e.tmp("acc_in")
    body_start = len(e.lines)
    g64 = e(f"zext i32 {g} to i64")
    sa, sb = scale_word("a", g64), scale_word("b", g64)
    acc = acc_in
    for j in range(unroll):
        first = e(f"mul i64 {g64}, {unroll}")
        s64 = e(f"add i64 {first}, {j}")
        acc = step(acc, s64, sa, sb, j)
    g_next = e(f"add i32 {g}, 1", "g_next")
    done = e(f"icmp eq i32 {g_next}, {ngroups}")
    e.raw(f"  br i1 {done}, label %tail, label %loop")
    e.lines.insert(body_start, f"  {acc_in} = phi <16 x float> [ zeroinitializer, %entry ], [ {acc}, %loop ]")
    e.lines.insert(body_start, f"  {g} = phi i32 [ 0, %entry ], [ {g_next}, %loop ]")
    acc_loop = acc

    # --- tail: the last nsteps % 4 steps (cdna4_32 only) ----------------------------------
    e.raw("tail:")
    acc_t = e(f"phi <16 x float> [ zeroinitializer, %entry ], [ {acc_loop}, %loop ]", "acc_t")
    incoming = [(acc_t, "%tail")]
    if unroll > 1:
        rem = e(f"and i32 {nsteps}, {unroll - 1}", "rem")
        any_left = e(f"icmp ugt i32 {rem}, 0")
        e.raw(f"  br i1 {any_left}, label %tail0, label %store")
        gt64 = e.tmp("gt")
        acc = acc_t
        for j in range(unroll - 1):
            e.raw(f"tail{j}:")
            if j == 0:
                e.lines.append(f"  {gt64} = zext i32 {ngroups} to i64")
                sa, sb = scale_word("a", gt64), scale_word("b", gt64)
            first = e(f"mul i64 {gt64}, {unroll}")
            s64 = e(f"add i64 {first}, {j}")
            acc = step(acc, s64, sa, sb, j)
            incoming.append((acc, f"%tail{j}"))
            nxt = f"%tail{j + 1}" if j + 1 < unroll - 1 else "%store"
            if j + 1 < unroll - 1:
                more = e(f"icmp ugt i32 {rem}, {j + 1}")
                e.raw(f"  br i1 {more}, label {nxt}, label %store")
            else:
                e.raw("  br label %store")
    else:
        e.raw("  br label %store")

    # --- store the 16 accumulators: acc[v] -> C[8 (v // 4) + 4 h + v % 4, r] ---------------
    e.raw("store:")
    phi = ", ".join(f"[ {v}, {blk} ]" for v, blk in incoming)
    acc = e(f"phi <16 x float> {phi}", "acc_out")
    tm32, h4, tn32 = e(f"shl i32 {tm}, 5"), e(f"shl i32 {h}, 2"), e(f"shl i32 {tn}, 5")
    row0 = e(f"add i32 {tm32}, {h4}")
    col = e(f"add i32 {tn32}, {r}")
    row0_64, col64 = e(f"zext i32 {row0} to i64"), e(f"zext i32 {col} to i64")
    row_first = e(f"mul i64 {row0_64}, {n64}")
    base = e(f"add i64 {row_first}, {col64}")
    for v in range(16):
        dr = 8 * (v // 4) + v % 4
        if dr:
            down = e(f"mul i64 {n64}, {dr}")
            idx = e(f"add i64 {base}, {down}")
        else:
            idx = base
        ptr = e(f"getelementptr inbounds float, {P} %c, i64 {idx}")
        val = e(f"extractelement <16 x float> {acc}, i32 {v}")
        e.raw(f"  store float {val}, {P} {ptr}, align 4")
    e.raw("  ret void")

    body = "\n".join(e.lines)
    return f"""; {name}: block-scaled GEMM tile kernel, assembled for gfx950, not run (nqdq.kernels.cdna4)
target datalayout = "e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-p7:160:256:256:32-p8:128:128:128:48-p9:192:256:256:32-i64:64-v16:16-v24:32-v32:32-v48:64-v96:128-v192:256-v256:256-v512:512-v1024:1024-v2048:2048-n32:64-S32-A5-G1-ni:7:8:9"
target triple = "amdgcn-amd-amdhsa"

declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.workgroup.id.y()
declare <16 x float> @{mfma}({ta}, {tb}, <16 x float>, i32, i32, i32, i32, i32, i32)

define amdgpu_kernel void @{name}({P} noalias readonly %a, {P} noalias readonly %b, {P} noalias readonly %scale_a, {P} noalias readonly %scale_b, {P} noalias writeonly %c, i32 %M, i32 %N, i32 %K) #0 {{
{body}
}}

attributes #0 = {{ "amdgpu-flat-work-group-size"="64,64" "uniform-work-group-size"="true" }}
"""
