"""Kernels generated from source text, one statement per unit, and why they are.

Why source text and not a Python closure: a thread of the 16-byte-unit kernels holds U units
(U * K for the group kernels: U and K are per-configuration constants, 1 to 16) from its
loads to its stores, each a tuple of four uint32 words. They must stay in registers: all U
loads are issued before the first is used (each one's latency hides behind the others), and
the encode of every unit waits for the statistics over all of them. NVVM keeps a value in
registers only where every access names it directly; Numba has no loop-unroll directive, and
a loop over a local array whose trip count NVVM does not unroll (calls and branches in its
body) puts the units in local memory instead. A fixed Python body cannot name U registers
for every U, so the kernel's per-unit statements are written out from a template and compiled
by ``exec``: a template line holding ``{j}`` (and ``{jNT}`` = j * NT) is repeated for j = 0 ..
U - 1, one holding ``{k}`` for k = 0 .. K - 1 (j outer), so that every unit is its own named
register tuple ``w{j}`` (``w{j}_{k}``). Only the statements are generated: every device
function they call and every constant of the configuration is an ordinary module function
or closure, given to the template as a name. The text is kept on the result (``.source``).

``compile_source`` is the one ``exec`` of the quantize kernels: ``jit_unrolled`` (the
last-axis and tile kernels) and the centred group step (``stat_chunks``), whose W = K * VEC
elements are W named registers for the same reason, go through it; so does the fused row
kernel (``gpu.fused.rows``). The per-channel kernels (``columns``, ``column_ring``,
``column_cluster``), the tensor-resident kernels and the GEMM epilogue generate theirs for
this reason too. (Host code generated for speed, the launch packers, has its note in
``runtime.packers``.)
"""

from __future__ import annotations

from ..runtime.backend import cuda


def compile_source(src, label, glb, name):
    """The function ``name`` that the generated source ``src`` defines, compiled by exec with
    the global names ``glb`` (a dict it adds the function to; ``label``: its file name in
    tracebacks). See the module docstring for why the source is generated."""
    exec(compile(src, label, "exec"), glb)
    return glb[name]


def sub_once(src, old, new):
    """``src`` with its one occurrence of ``old`` replaced (the SR variants' edits of a kernel
    template: an edit that no longer finds its text fails loudly instead of doing nothing)."""
    assert src.count(old) == 1, (old, src.count(old))
    return src.replace(old, new)


def expand_units(template, NT, U, K=1):
    """The source of ``template`` with its per-unit lines written out: a line holding ``{j}``
    (and ``{jNT}`` = j * NT) is repeated for j = 0 .. U-1, one holding ``{k}`` for k = 0 ..
    K-1 (j outer)."""
    lines = []
    for ln in template.splitlines():
        js = range(U) if ("{j}" in ln or "{jNT}" in ln) else [None]
        ks = range(K) if "{k}" in ln else [None]
        for jj in js:
            for kk in ks:
                out = ln
                if jj is not None:
                    out = out.replace("{jNT}", str(jj * NT)).replace("{j}", str(jj))
                if kk is not None:
                    out = out.replace("{k}", str(kk))
                lines.append(out)
    return "\n".join(lines) + "\n"


def jit_unrolled(name, template, ns, U, K, names):
    """The kernel ``name`` of ``template`` with its per-unit statements written out
    (expand_units, NT = ns["NT"]), compiled with the global names ``names`` (a module's
    ``globals()``: the device functions the statements call) and the configuration's ``ns``."""
    src = expand_units(template, ns["NT"], U, K)
    glb = dict(names)
    glb.update(ns)
    fn = compile_source(src, f"<nqdq {name} U={U} K={K}>", glb, name)
    fn.source = src
    return cuda.jit(fn)
