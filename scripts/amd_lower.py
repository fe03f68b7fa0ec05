"""Lower a kernel to AMDGPU LLVM IR with numba-hip's front end and compile it for gfx950 with
llvmlite, on a machine without ROCm (not CI; docs/amd.md, "Lowering without ROCm").

Run it in an environment of its own (numba-hip cannot share one with numba-cuda):

    python -m venv /tmp/hip && /tmp/hip/bin/pip install "numba-hip>=0.2.1"
    # ROCm's wheels link zlib / zstd as librocm_sysdeps_z{,std}.so.1 (symbol version
    # AMDROCM_SYSDEPS_1.0): build forwarders to the system's libz / libzstd, see --shim-c
    /tmp/hip/bin/python scripts/amd_lower.py --shim-c > /tmp/shim.c
    echo 'AMDROCM_SYSDEPS_1.0 { global: *; };' > /tmp/shim.map
    for n in z zstd; do gcc -shared -fPIC -O2 -o /tmp/shim/librocm_sysdeps_$n.so.1 /tmp/shim.c \
        -Wl,--version-script=/tmp/shim.map -Wl,-soname,librocm_sysdeps_$n.so.1 -ldl; done
    LD_LIBRARY_PATH=/tmp/shim /tmp/hip/bin/python scripts/amd_lower.py --arch gfx950

Workarounds (each replaces something ROCm provides): comgr's ISA table (``libamd_comgr``) is
written out; the HIP device library, which numba-hip builds at import from ROCm's HIP headers
with ROCm's clang, is replaced by an empty one that lowers only ``threadIdx`` / ``blockIdx``
(the ``llvm.amdgcn.workitem.id`` / ``workgroup.id`` intrinsics); the target attributes
numba-hip reads off a HIP snippet compiled by comgr are written as ``"target-cpu"``. So only
kernels that use thread / block indices, array indexing, integer and float arithmetic lower;
``cuda.grid``, ``blockDim``, barriers, shared memory and math calls go through the device
library and do not. No code object is linked (that needs ROCm's lld through comgr).

Prints the instructions of the gfx950 assembly that touch memory, and exits 1 unless a load
and a byte store appear (``flat_*``: numba-hip's arrays are generic pointers, not
``addrspace(1)``, so the back end cannot use ``global_*``).
"""

from __future__ import annotations

import argparse
import sys
import types as pytypes

SHIM_C = r"""/* Forwarders: ROCm's wheels link zlib / zstd under the symbol version AMDROCM_SYSDEPS_1.0. */
#include <dlfcn.h>
#include <stddef.h>
static void *lib(const char *n) { static void *h[2]; int i = n[5] == 's'; if (!h[i]) h[i] = dlopen(n, RTLD_NOW); return h[i]; }
#define FWD(L, R, NAME, PARAMS, ARGS) R NAME PARAMS { static R (*f) PARAMS; if (!f) f = (R (*) PARAMS) dlsym(lib(L), #NAME); return f ARGS; }
#define Z "libz.so.1"
#define S "libzstd.so.1"
FWD(Z, int, compress2, (unsigned char *d, unsigned long *dl, const unsigned char *s, unsigned long sl, int lv), (d, dl, s, sl, lv))
FWD(Z, unsigned long, compressBound, (unsigned long n), (n))
FWD(Z, unsigned long, crc32, (unsigned long c, const unsigned char *b, unsigned int n), (c, b, n))
FWD(Z, int, uncompress, (unsigned char *d, unsigned long *dl, const unsigned char *s, unsigned long sl), (d, dl, s, sl))
FWD(S, int, ZSTD_CCtx_setParameter, (void *c, int p, int v), (c, p, v))
FWD(S, size_t, ZSTD_compress2, (void *c, void *d, size_t dc, const void *s, size_t sn), (c, d, dc, s, sn))
FWD(S, size_t, ZSTD_compressBound, (size_t n), (n))
FWD(S, void *, ZSTD_createCCtx, (void), ())
FWD(S, size_t, ZSTD_decompress, (void *d, size_t dc, const void *s, size_t sn), (d, dc, s, sn))
FWD(S, size_t, ZSTD_freeCCtx, (void *c), (c))
FWD(S, const char *, ZSTD_getErrorName, (size_t c), (c))
FWD(S, unsigned, ZSTD_isError, (size_t c), (c))
"""

ARCHS = ("gfx90a", "gfx942", "gfx950")


def _isa(name):
    # the fields numba.hip.amdgcn.ISAInfo reads; gfx9 CDNA values (64 KiB LDS, 512 VGPRs with AGPRs)
    return {"AddressableNumSGPRs": "102", "AddressableNumVGPRs": "512", "TotalNumSGPRs": "800",
            "TotalNumVGPRs": "512", "SGPRAllocGranule": "8", "VGPRAllocGranule": "8", "Architecture": "amdgcn",
            "Vendor": "amd", "OS": "amdhsa", "Processor": name, "Features": "", "Environment": "",
            "MaxFlatWorkGroupSize": "1024", "MaxWavesPerCU": "32", "EUsPerCU": "4", "LocalMemorySize": "65536",
            "LDSBankCount": "32", "TrapHandlerEnabled": "1", "Version": "1", "Name": f"amdgcn-amd-amdhsa--{name}"}


class _NoDeviceLib:
    """A HIP device library function the empty library cannot lower."""

    _call_generators_ = ()


def _amdgcn_reg(intrinsic_name):
    from llvmlite import ir

    def gen(context, builder, sig, args):
        fn = builder.module.declare_intrinsic(intrinsic_name, fnty=ir.FunctionType(ir.IntType(32), []))
        return builder.call(fn, [])

    return pytypes.SimpleNamespace(_call_generators_=[(gen, None)])


def _device_lib_attr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _NoDeviceLib()


def import_numba_hip():
    """numba.hip with the ROCm-dependent pieces replaced (see the module docstring)."""
    import rocm.comgr as comgr_pkg
    import rocm.comgr.comgr as comgr

    comgr.get_isa_metadata_all = comgr_pkg.get_isa_metadata_all = lambda: {
        f"amdgcn-amd-amdhsa--{n}": _isa(n) for n in ARCHS}
    lib = pytypes.ModuleType("numba.hip.typing_lowering.hipdevicelib")
    lib.thestubs, lib.unsupported_stubs, lib.reload = {}, {}, lambda: None
    lib.__getattr__ = _device_lib_attr
    for dim, reg in (("threadIdx", "workitem"), ("blockIdx", "workgroup")):
        setattr(lib, "get_" + dim, pytypes.SimpleNamespace(
            **{a: _amdgcn_reg(f"llvm.amdgcn.{reg}.id.{a}") for a in "xyz"}))
    sys.modules[lib.__name__] = lib

    from numba import hip
    from numba.hip.util import comgrutils

    comgrutils.get_target_specific_attributes = lambda arch: [f'"target-cpu"="{arch}"']
    return hip


def lower_example(hip, arch):
    """AMDGPU LLVM IR of a kernel written the portable way (integer bit work, no fp16 types)."""
    import numpy as np
    from numba import types

    def e8m0_of_f32_bits(x, out):
        # the biased exponent of each float32 (bits 23-30), the e8m0 code of its power of two
        i = hip.blockIdx.x * 256 + hip.threadIdx.x
        if i < x.shape[0]:
            out[i] = np.uint8((x[i] >> np.uint32(23)) & np.uint32(0xFF))

    sig = types.void(types.uint32[::1], types.uint8[::1])
    ir_text = hip.compile_llvm_ir(e8m0_of_f32_bits, sig, amdgpu_arch=arch, link_in_hipdevicelib=False)
    if isinstance(ir_text, tuple):
        ir_text = ir_text[0]
    return ir_text.decode() if isinstance(ir_text, bytes) else ir_text


def assemble(ir_text, arch):
    import llvmlite.binding as llvm

    try:
        llvm.initialize()
    except RuntimeError:  # llvmlite >= 0.45 initializes itself
        pass
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    tm = llvm.Target.from_triple("amdgcn-amd-amdhsa").create_target_machine(cpu=arch, opt=2)
    return tm.emit_assembly(mod)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="gfx950", choices=ARCHS)
    ap.add_argument("--ir", help="write the AMDGPU LLVM IR here")
    ap.add_argument("--shim-c", action="store_true", help="print the zlib / zstd forwarders' C source and exit")
    args = ap.parse_args(argv)
    if args.shim_c:
        print(SHIM_C, end="")
        return 0
    hip = import_numba_hip()
    ir_text = lower_example(hip, args.arch)
    if args.ir:
        with open(args.ir, "w") as f:
            f.write(ir_text)
    asm = assemble(ir_text, args.arch)
    mem = [ln.strip() for ln in asm.splitlines() if ln.strip().startswith(("global_", "buffer_", "flat_"))]
    import llvmlite

    print(f"{args.arch} (llvmlite {llvmlite.__version__}): {len(ir_text.splitlines())} lines of LLVM IR, {len(asm.splitlines())} of assembly")
    print("\n".join(mem))
    ok = any("_load_" in m for m in mem) and any("_store_byte" in m for m in mem)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
