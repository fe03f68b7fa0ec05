"""What several intrinsic families build on (compiled targets only): ``_elem_ptr``, the LLVM
pointer to an array's element, and ``void_asm``, an intrinsic of one PTX instruction with no
operands (barriers, fences, ``griddepcontrol``; ``mma`` builds its NVIDIA-only ones with it
too). Under the simulator neither exists: every caller binds its twin there."""

from __future__ import annotations

from ..runtime.target import SIMULATOR

if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _elem_ptr(context, builder, aryty, ary, idx, idxty):
        arr = context.make_array(aryty)(context, builder, ary)
        i64 = context.cast(builder, idx, idxty, types.int64)
        return builder.gep(arr.data, [i64])

    def void_asm(text):
        """An intrinsic of no arguments and no result: the PTX ``text``, a side effect that
        clobbers memory (so loads and stores stay on their side of it)."""

        @intrinsic
        def _asm(typingctx):
            sig = types.void()

            def codegen(context, builder, sig, args):
                fty = ir.FunctionType(ir.VoidType(), [])
                builder.call(ir.InlineAsm(fty, text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()

            return sig, codegen

        return _asm
