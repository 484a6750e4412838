"""The oracle: naive, independent pure-PyTorch references for SPEC §2 (element formats), §3 (activations), §4
(per-tensor, MXFP8, FP8 block and NVFP4 scaling) and §5 (fusion paths), one module per section. Tests write
`from tests import ref` and call `ref.<name>`; every public name of the modules is re-exported here.

Every rounding step is spelled out: "fp32 op" means a float32 torch tensor op on CPU, which rounds once, to nearest
even (IEEE); activations are evaluated in float64. The references take torch tensors; the JAX frontend's tests hand
them their arrays through `ref.as_torch` (DLPack, no copy), so both frontends are judged by this one oracle."""
from .common import F32, F64, FLT_MAX, as_torch, ceil_div, f32, roundup
from .fp8 import (DTYPE_INT, FP8_EXP_BIAS, FP8_MANT_BITS, FP8_MAX, FP8_MAX_CODE, FP8_NAN_CODE, FP8_TORCH, fmt_of,
                  fp8_boundary_values, fp8_decode, fp8_decode_scalar, fp8_encode, fp8_encode_scalar,
                  fp8_finite_values, fp8_is_nan_code, fp8_ordinal)
from .per_tensor import (QRef, act_fp8_current_ref, act_fp8_delayed_ref, amax_and_scale_update_ref, amax_ref,
                         clear_mantissa, current_scale_ref, dequantize_ref, quantize_current_ref,
                         quantize_delayed_ref, reciprocal_f32, rnd_in, transpose_codes)
from .activations import (ACT_CODE, ACT_NAMES, BASE, C_044715, C_GELU_CUBIC, C_GELU_D, C_QGELU, C_SQRT_2_PI,
                          DACT_NAMES, DBIAS_NAMES, GATED, _df, _f, act_ref, dact_ref, dbias_ref, out_shape)
from .grouped import grouped_rows
from .compare import (FP8_TOL, TOL, assert_bytes_equal, assert_close_tol, assert_codes_rn_forgiving, bits_equal,
                      codes_mismatch_report, within_tol)
from .mxfp8 import (FP8_EMAX, MX_BLOCK, MX_INV_MAX, MXRef, dequantize_mxfp8_ref, e8m0_encode, e8m0_encode_scalar,
                    e8m0_floor_rule, e8m0_multiplier, e8m0_value, mx_scale_shapes, quantize_mxfp8_ref, swizzle_mx_ref,
                    swizzle_ref)
from .fp8_block import (FB_BLOCK, FBRef, dequantize_fp8_block_ref, fb_block_scale, fb_scale_shapes, input_max_finite,
                        quantize_fp8_block_ref)
from .e2m1 import E2M1_GRID, e2m1_decode, e2m1_encode, e2m1_encode_sr, nv_pack, nv_unpack
from .nvfp4 import (NV_BLOCK, NV_INV2688, NV_INV6, NV_INV_FLT_MAX, NVRef, RHT_SIGNS, dequantize_nvfp4_ref,
                    nv_block_random_bytes, nv_decode_factors_ref, nv_global_scale, nv_scale_shapes, philox4x32_10,
                    quantize_nvfp4_ref, rht_matrix_ref, rht_ref)
from .normalization import (layernorm_fwd_ref, norm_bwd_ref, norm_gamma64, norm_output_f32,
                            rmsnorm_fwd_ref)
