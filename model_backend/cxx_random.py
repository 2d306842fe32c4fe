"""std::mt19937 and the libstdc++ real distributions, reproduced in numpy.

Reference mode must draw exactly the random numbers llama.cpp's diffusion example draws.
`std::mt19937(seed)` is the Mersenne Twister with Matsumoto/Nishimura's `init_genrand(seed)`
seeding, which numpy's legacy `RandomState` seeding also uses. libstdc++'s
`generate_canonical<T, digits(T)>` (bits/random.tcc) consumes ceil(digits / 32) 32-bit outputs:
one for float, two for double, combined as (x0 + x1 * 2^32) / 2^64 and clamped below 1.
"""

from __future__ import annotations

import numpy as np


class CxxMt19937:
    def __init__(self, seed: int) -> None:
        self._bits = np.random.RandomState(seed & 0xFFFFFFFF)._bit_generator

    def raw(self, n: int) -> np.ndarray:
        """n consecutive 32-bit outputs (as uint64)."""
        if n <= 0:
            return np.empty(0, dtype=np.uint64)
        return self._bits.random_raw(n)

    def uniform_float(self, n: int) -> np.ndarray:
        """`std::uniform_real_distribution<float>(0, 1)` drawn n times."""
        x = self.raw(n).astype(np.float32) / np.float32(4294967296.0)
        return np.where(x >= 1.0, np.nextafter(np.float32(1), np.float32(0)), x).astype(np.float32)

    def uniform_double(self, n: int) -> np.ndarray:
        """`std::uniform_real_distribution<double>(0, 1)` drawn n times (two outputs each)."""
        r = self.raw(2 * n).reshape(n, 2).astype(np.float64)
        x = (r[:, 0] + r[:, 1] * 4294967296.0) / 18446744073709551616.0
        return np.where(x >= 1.0, np.nextafter(1.0, 0.0), x)


def _self_check() -> None:
    # The C++ standard fixes the 10000th output of a default-seeded std::mt19937 at 4123659995.
    if int(CxxMt19937(5489).raw(10000)[-1]) != 4123659995:
        raise RuntimeError("numpy's MT19937 does not reproduce std::mt19937; reference mode is unavailable")


_self_check()
