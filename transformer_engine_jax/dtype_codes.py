"""The core's DType codes (SPEC §1.3, te::DType) of the element types tej's FFI calls pass or return: one home for
the table the GEMM, grouped GEMM and collective GEMM calls share (`CODE[jnp.dtype] -> int`, `DTYPE[int] -> jnp.dtype`).
"""
import jax.numpy as jnp

CODE = {jnp.dtype(jnp.uint8): 0, jnp.dtype(jnp.float32): 4, jnp.dtype(jnp.float16): 5, jnp.dtype(jnp.bfloat16): 6,
        jnp.dtype(jnp.float8_e4m3fn): 7, jnp.dtype(jnp.float8_e5m2): 8}
DTYPE = {code: dtype for dtype, code in CODE.items()}
