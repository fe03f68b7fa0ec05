"""LLVM IR (text) of a block-scaled GEMM for gfx950 -- assembled for gfx950, not run.

``C[M, N] = dequant(A[M, K]) @ dequant(B[N, K]).T`` in float32, with A and B packed codes
(row-major, ``reference/packing.py``: one byte per fp8 code, four fp6 codes in three bytes,
two fp4 codes a byte) and e8m0 scales per 32 of K. One workgroup of one wavefront (64
lanes) computes one 32 x 32 tile of C: workgroup id x is the tile column (N / 32), id y the
tile row (M / 32). Two instructions (:data:`.operands.SHAPES`, chosen by ``mfma_dim``):

``mfma_dim=32``: ``llvm.amdgcn.mfma.scale.f32.32x32x64.f8f6f4``
    one instruction per K step of 64 covers the tile; 16 accumulators a lane.
``mfma_dim=16``: ``llvm.amdgcn.mfma.scale.f32.16x16x128.f8f6f4``
    the tile is 2 x 2 sub-tiles of 16 x 16: per K step of 128 each lane loads the operands
    of both 16-row halves of A and of B and issues four instructions (A half ``i``, B half
    ``j``), 4 x 4 accumulators a lane.

Per K step each lane loads the bytes its registers hold (:func:`.operands.lane_load_chunks`)
and its scales; at the end it stores its accumulators (:func:`.operands.accumulator_coords`).
No LDS, no bounds checks: M, N must be multiples of 32 and K of the instruction's K
(:func:`.gemm_twin.check_gemm_shape`, which a launcher must call).

Scale layouts (the kernels, as a rule table: :data:`STEPS_PER_SCALE_WORD`):

``cdna4_32`` (``reference.layouts.CDNA4(32)``, read by the 32x32x64 kernel)
    lane ``l`` loads the 32-bit word at byte ``((tile * ceil(K / 256) + s // 4) * 256 + 4 l)``
    of the stored ``[ceil(rows / 32), ceil(K / 32 / 8) * 8 * 32]`` array once per four K
    steps and passes byte ``s % 4`` of it to step ``s`` through ``opsel``.
``cdna4_16`` (``reference.layouts.CDNA4(16)``, read by the 16x16x128 kernel)
    the same word address with ``s // 2`` for ``s // 4``: one word per lane per two K steps
    of 128, byte ``2 (s % 2) + i`` for step ``s`` and 16-row half ``i`` (the A half for
    ``opsel_a``, the B half for ``opsel_b``).
``linear`` (either kernel)
    lane ``l`` loads byte ``row * (K / 32) + (k / 32) s + l // dim`` of the ``[rows, K / 32]``
    scales (``row`` = tile row + ``dim`` * half + l % dim) every step, ``opsel = 0``.

``opsel`` is an immediate, so the K loop is unrolled by the steps of a scale word (4 or 2),
with a tail of up to 3 or 1 steps. The same index math, run in NumPy, is
:func:`.gemm_twin.gemm_twin`.
"""

from __future__ import annotations

from .operands import WAVE_TILE, MfmaOperand, MfmaShape, lane_load_chunks, mfma_shape, operand

__all__ = [
    "gemm_ir", "kernel_name", "mfma_intrinsic", "gemm_variant", "SCALE_LAYOUTS", "STEPS_PER_SCALE_WORD",
    "mfmas_per_step",
]

_PTR = "ptr addrspace(1)"  # a global-memory pointer

# (mfma_dim, scale layout) -> K steps unrolled per loop iteration: the kernels there are
STEPS_PER_SCALE_WORD = {(32, "cdna4_32"): 4, (32, "linear"): 1, (16, "cdna4_16"): 2, (16, "linear"): 1}
SCALE_LAYOUTS = {dim: tuple(lay for d, lay in STEPS_PER_SCALE_WORD if d == dim) for dim, _ in STEPS_PER_SCALE_WORD}


def gemm_variant(mfma_dim=32, scale_layout=None) -> tuple[MfmaShape, str]:
    """(instruction shape, scale layout) of a kernel; ``scale_layout=None`` is the
    instruction's own preshuffle, ``cdna4_{mfma_dim}``."""
    shape = mfma_shape(mfma_dim)
    layout = f"cdna4_{shape.dim}" if scale_layout is None else scale_layout
    if (shape.dim, layout) not in STEPS_PER_SCALE_WORD:
        raise ValueError(
            f"scale_layout={layout!r} is not read by the {shape.name} kernel; one of {SCALE_LAYOUTS[shape.dim]}")
    return shape, layout


def mfmas_per_step(mfma_dim=32) -> int:
    """Scaled MFMAs per K step of the 32 x 32 wave tile: 1 (32x32x64) or 4 (16x16x128)."""
    return (WAVE_TILE // mfma_shape(mfma_dim).dim) ** 2


def kernel_name(fmt_a, fmt_b, scale_layout=None, mfma_dim=32) -> str:
    shape, layout = gemm_variant(mfma_dim, scale_layout)
    return f"nqdq_mx_gemm_{operand(fmt_a).fmt.name}_{operand(fmt_b).fmt.name}_{shape.name}_{layout}"


def mfma_intrinsic(op_a: MfmaOperand, op_b: MfmaOperand, shape: MfmaShape) -> str:
    return f"{shape.intrinsic}.v{op_a.regs}i32.v{op_b.regs}i32"


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


def _load_operand(e: _Emitter, op: MfmaOperand, shape: MfmaShape, lane_row_ptr: str, step: str, stem: str) -> str:
    """The ``<regs x i32>`` operand of K step ``step`` (i64) for this lane."""
    base = e(f"mul i64 {step}, {op.step_bytes(shape)}")
    parts = []
    for offset, nbytes in lane_load_chunks(op, 0, shape):  # the group's offset is in lane_row_ptr
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


def _scale_pointers(e: _Emitter, rows: dict, preshuffled: bool, k64: str, lane64: str, g64: str, nsteps: str):
    """({"a" / "b": [this lane's scale pointer of each half]}, the main loop's trip count):
    with a cdna4 layout one pointer, shared by the halves, and one iteration per 256 of K;
    with ``linear`` one pointer a half and one iteration per K step (``nsteps``)."""
    scale_ptrs = {}
    if preshuffled:
        k255 = e(f"add i64 {k64}, 255")
        chunks = e(f"lshr i64 {k255}, 8", "chunks")  # 256-byte chunks per 32 rows
        for who, sp in (("a", "%scale_a"), ("b", "%scale_b")):
            tile64 = e(f"zext i32 {rows[who][2]} to i64")
            first = e(f"mul i64 {tile64}, {chunks}")
            first_byte = e(f"shl i64 {first}, 8")
            lane_byte = e(f"shl i64 {lane64}, 2")
            base = e(f"add i64 {first_byte}, {lane_byte}")
            scale_ptrs[who] = [e(f"getelementptr inbounds i8, {_PTR} {sp}, i64 {base}", f"s{who}_lane")]
        return scale_ptrs, e("lshr i32 %K, 8", "ngroups")
    kb = e(f"lshr i64 {k64}, 5", "kblocks")
    for who, sp in (("a", "%scale_a"), ("b", "%scale_b")):
        scale_ptrs[who] = []
        for row64 in rows[who][1]:
            row_first = e(f"mul i64 {row64}, {kb}")
            base = e(f"add i64 {row_first}, {g64}")
            scale_ptrs[who].append(e(f"getelementptr inbounds i8, {_PTR} {sp}, i64 {base}", f"s{who}_lane"))
    return scale_ptrs, nsteps


def gemm_ir(fmt_a, fmt_b, scale_layout=None, mfma_dim=32) -> str:
    """The LLVM IR module (text) of the kernel ``kernel_name(fmt_a, fmt_b, scale_layout,
    mfma_dim)``:

    ``void @name(ptr addrspace(1) a, b, scale_a, scale_b, c, i32 M, i32 N, i32 K)``, launched
    with grid (N / 32, M / 32) of 64-lane workgroups. ``fmt_a`` / ``fmt_b``: "e4m3",
    "e5m2", "e2m3", "e3m2", "e2m1" (mixed pairs allowed); ``mfma_dim``: 32 (32x32x64) or 16
    (16x16x128); ``scale_layout``: ``cdna4_{mfma_dim}`` (the default) or "linear".
    """
    op_a, op_b = operand(fmt_a), operand(fmt_b)
    shape, scale_layout = gemm_variant(mfma_dim, scale_layout)
    unroll = STEPS_PER_SCALE_WORD[shape.dim, scale_layout]
    preshuffled = scale_layout != "linear"  # a cdna4 word: one load per `unroll` steps, opsel picks
    halves = WAVE_TILE // shape.dim  # sub-tiles of the wave tile per side: 1 or 2
    name = kernel_name(op_a, op_b, scale_layout, shape)
    mfma = mfma_intrinsic(op_a, op_b, shape)
    ta, tb = f"<{op_a.regs} x i32>", f"<{op_b.regs} x i32>"
    tacc = f"<{shape.accumulators} x float>"
    e = _Emitter()
    log2_dim, log2_k = shape.dim.bit_length() - 1, shape.k.bit_length() - 1

    # --- entry: lane, tile, row pointers -------------------------------------------------
    e.raw("entry:")
    lane = e("call i32 @llvm.amdgcn.workitem.id.x()", "lane")
    tn = e("call i32 @llvm.amdgcn.workgroup.id.x()", "tn")
    tm = e("call i32 @llvm.amdgcn.workgroup.id.y()", "tm")
    r = e(f"and i32 {lane}, {shape.dim - 1}", "r")
    g = e(f"lshr i32 {lane}, {log2_dim}", "g")
    k64 = e("zext i32 %K to i64", "k")
    n64 = e("zext i32 %N to i64", "n")
    g64 = e(f"zext i32 {g} to i64")
    lane64 = e(f"zext i32 {lane} to i64")
    rows = {}  # who -> ([lane pointer of each half], [i64 row of each half], tile)
    for who, tile, op, ptr in (("a", tm, op_a, "%a"), ("b", tn, op_b, "%b")):
        tile32 = e(f"shl i32 {tile}, 5")
        row = e(f"add i32 {tile32}, {r}", f"row_{who}")
        row64 = e(f"zext i32 {row} to i64")
        group_off = e(f"mul i64 {g64}, {lane_load_chunks(op, 1, shape)[0][0]}")
        row_bytes = _row_bytes(e, op, k64)
        row_off = e(f"mul i64 {row64}, {row_bytes}")
        off = e(f"add i64 {row_off}, {group_off}")
        ptrs, half_rows = [e(f"getelementptr inbounds i8, {_PTR} {ptr}, i64 {off}", f"{who}_lane")], [row64]
        for i in range(1, halves):
            down = e(f"mul i64 {row_bytes}, {shape.dim * i}")
            ptrs.append(e(f"getelementptr inbounds i8, {_PTR} {ptrs[0]}, i64 {down}", f"{who}_lane"))
            half_rows.append(e(f"add i64 {row64}, {shape.dim * i}"))
        rows[who] = (ptrs, half_rows, tile)
    nsteps = e(f"lshr i32 %K, {log2_k}", "nsteps")
    scale_ptrs, ngroups = _scale_pointers(e, rows, preshuffled, k64, lane64, g64, nsteps)
    skip = e(f"icmp eq i32 {ngroups}, 0")
    e.raw(f"  br i1 {skip}, label %tail, label %loop")

    def scale_words(who, group64):
        """The scale register of each half for scale word ``group64`` (i64)."""
        if preshuffled:
            off = e(f"shl i64 {group64}, 8")
            ptr = e(f"getelementptr inbounds i8, {_PTR} {scale_ptrs[who][0]}, i64 {off}")
            return [e(f"load i32, {_PTR} {ptr}, align 4", f"s{who}")] * halves
        words = []
        for half_ptr in scale_ptrs[who]:
            off = e(f"mul i64 {group64}, {shape.groups}")
            ptr = e(f"getelementptr inbounds i8, {_PTR} {half_ptr}, i64 {off}")
            byte = e(f"load i8, {_PTR} {ptr}, align 1")
            words.append(e(f"zext i8 {byte} to i32", f"s{who}"))
        return words

    def step(accs, step64, sa, sb, j):
        """K step ``step64`` (the ``j``-th of its scale word): every (A half, B half)."""
        a = [_load_operand(e, op_a, shape, p, step64, "opa") for p in rows["a"][0]]
        b = [_load_operand(e, op_b, shape, p, step64, "opb") for p in rows["b"][0]]
        out = []
        for i in range(halves):
            for jj in range(halves):
                # the cdna4 word's bytes: K step j of the word, then the half (1 half: byte j)
                opsel_a, opsel_b = (halves * j + i, halves * j + jj) if preshuffled else (0, 0)
                out.append(e(
                    f"call {tacc} @{mfma}({ta} {a[i]}, {tb} {b[jj]}, {tacc} {accs[halves * i + jj]}, "
                    f"i32 {op_a.code}, i32 {op_b.code}, i32 {opsel_a}, i32 {sa[i]}, i32 {opsel_b}, "
                    f"i32 {sb[jj]})", "acc"))
        return out

    nacc = halves * halves

    # --- main loop: `unroll` K steps per scale word ---------------------------------------
    e.raw("loop:")
    grp = e.tmp("grp")
    acc_in = [e.tmp("acc_in") for _ in range(nacc)]
    body_start = len(e.lines)
    grp64 = e(f"zext i32 {grp} to i64")
    sa, sb = scale_words("a", grp64), scale_words("b", grp64)
    accs = acc_in
    for j in range(unroll):
        first = e(f"mul i64 {grp64}, {unroll}")
        s64 = e(f"add i64 {first}, {j}")
        accs = step(accs, s64, sa, sb, j)
    grp_next = e(f"add i32 {grp}, 1", "grp_next")
    done = e(f"icmp eq i32 {grp_next}, {ngroups}")
    e.raw(f"  br i1 {done}, label %tail, label %loop")
    for x_in, x in zip(reversed(acc_in), reversed(accs)):
        e.lines.insert(body_start, f"  {x_in} = phi {tacc} [ zeroinitializer, %entry ], [ {x}, %loop ]")
    e.lines.insert(body_start, f"  {grp} = phi i32 [ 0, %entry ], [ {grp_next}, %loop ]")
    acc_loop = accs

    # --- tail: the last nsteps % unroll steps (cdna4 layouts only) -------------------------
    e.raw("tail:")
    accs = [e(f"phi {tacc} [ zeroinitializer, %entry ], [ {x}, %loop ]", "acc_t") for x in acc_loop]
    incoming = [(accs, "%tail")]
    if unroll > 1:
        rem = e(f"and i32 {nsteps}, {unroll - 1}", "rem")
        any_left = e(f"icmp ugt i32 {rem}, 0")
        e.raw(f"  br i1 {any_left}, label %tail0, label %store")
        gt64 = e.tmp("gt")
        for j in range(unroll - 1):
            e.raw(f"tail{j}:")
            if j == 0:
                e.lines.append(f"  {gt64} = zext i32 {ngroups} to i64")
                sa, sb = scale_words("a", gt64), scale_words("b", gt64)
            first = e(f"mul i64 {gt64}, {unroll}")
            s64 = e(f"add i64 {first}, {j}")
            accs = step(accs, s64, sa, sb, j)
            incoming.append((accs, f"%tail{j}"))
            if j + 1 < unroll - 1:
                more = e(f"icmp ugt i32 {rem}, {j + 1}")
                e.raw(f"  br i1 {more}, label %tail{j + 1}, label %store")
            else:
                e.raw("  br label %store")
    else:
        e.raw("  br label %store")

    _store_block(e, shape, incoming, tm, tn, g, r, n64)
    return _module_text(name, mfma, ta, tb, tacc, "\n".join(e.lines))


def _store_block(e: _Emitter, shape: MfmaShape, incoming: list, tm: str, tn: str, g: str, r: str, n64: str):
    """The ``store`` block: the accumulators' phis over ``incoming`` ([(values, block)]), then
    accumulator v of half pair (i, j) -> C[dim i + accumulator row, dim j + r]."""
    halves = WAVE_TILE // shape.dim
    tacc = f"<{shape.accumulators} x float>"
    e.raw("store:")
    outs = []
    for x in range(halves * halves):
        phi = ", ".join(f"[ {vals[x]}, {blk} ]" for vals, blk in incoming)
        outs.append(e(f"phi {tacc} {phi}", "acc_out"))
    tm32, g4, tn32 = e(f"shl i32 {tm}, 5"), e(f"shl i32 {g}, 2"), e(f"shl i32 {tn}, 5")
    row0 = e(f"add i32 {tm32}, {g4}")
    col = e(f"add i32 {tn32}, {r}")
    row0_64, col64 = e(f"zext i32 {row0} to i64"), e(f"zext i32 {col} to i64")
    row_first = e(f"mul i64 {row0_64}, {n64}")
    base = e(f"add i64 {row_first}, {col64}")  # C[tile row + 4 g, tile column + r]
    for i in range(halves):
        for jj in range(halves):
            for v in range(shape.accumulators):
                # accumulator_coords(lane, v) less the lane's 4 g, r; plus the halves' offsets
                down_rows = shape.dim * i + 4 * shape.groups * (v // 4) + v % 4
                idx = base
                if down_rows:
                    down = e(f"mul i64 {n64}, {down_rows}")
                    idx = e(f"add i64 {idx}, {down}")
                if jj:
                    idx = e(f"add i64 {idx}, {shape.dim * jj}")
                ptr = e(f"getelementptr inbounds float, {_PTR} %c, i64 {idx}")
                val = e(f"extractelement {tacc} {outs[halves * i + jj]}, i32 {v}")
                e.raw(f"  store float {val}, {_PTR} {ptr}, align 4")
    e.raw("  ret void")


def _module_text(name: str, mfma: str, ta: str, tb: str, tacc: str, body: str) -> str:
    """The LLVM module around the kernel's ``body`` (its basic blocks)."""
    return f"""; {name}: block-scaled GEMM tile kernel, assembled for gfx950, not run (nqdq.gpu.cdna4)
target datalayout = "e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-p7:160:256:256:32-p8:128:128:128:48-p9:192:256:256:32-i64:64-v16:16-v24:32-v32:32-v48:64-v96:128-v192:256-v256:256-v512:512-v1024:1024-v2048:2048-n32:64-S32-A5-G1-ni:7:8:9"
target triple = "amdgcn-amd-amdhsa"

declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.workgroup.id.y()
declare {tacc} @{mfma}({ta}, {tb}, {tacc}, i32, i32, i32, i32, i32, i32)

define amdgpu_kernel void @{name}({_PTR} noalias readonly %a, {_PTR} noalias readonly %b, {_PTR} noalias readonly %scale_a, {_PTR} noalias readonly %scale_b, {_PTR} noalias writeonly %c, i32 %M, i32 %N, i32 %K) #0 {{
{body}
}}

attributes #0 = {{ "amdgpu-flat-work-group-size"="64,64" "uniform-work-group-size"="true" }}
"""
