// Element-wise activation kernels shared by the PReLU, ELU, Swish, Power, Exp, Log, AbsVal, BNLL,
// Threshold and Clip layers. Dtype and CUDA_KERNEL_LOOP come from the backend prelude.
// Every kernel reads x[i] (or y[i]) before writing its output, so in-place use (x == y, dy == dx)
// is safe element by element.

// ---- PReLU: y = max(x, 0) + slope[c] * min(x, 0); c = (i / dim) % channels / div_factor -------
__global__ void prelu_forward(const int n, const int channels, const int dim, const Dtype* x,
                              Dtype* y, const Dtype* slope, const int div_factor) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / dim) % channels / div_factor;
    const Dtype v = x[i];
    y[i] = v > 0 ? v : v * slope[c];
  }
}
__global__ void prelu_backward(const int n, const int channels, const int dim, const Dtype* dy,
                               const Dtype* x, Dtype* dx, const Dtype* slope, const int div_factor) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / dim) % channels / div_factor;
    dx[i] = x[i] > 0 ? dy[i] : dy[i] * slope[c];
  }
}
// per-element contribution to the slope gradient: dy * x where x <= 0
__global__ void prelu_param_terms(const int n, const Dtype* dy, const Dtype* x, Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) { out[i] = x[i] <= 0 ? dy[i] * x[i] : Dtype(0); }
}

// ---- ELU: y = x > 0 ? x : alpha * (exp(x) - 1) ------------------------------------------------
__global__ void elu_forward(const int n, const Dtype* x, Dtype* y, const Dtype alpha) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype v = x[i];
    y[i] = v > 0 ? v : alpha * expm1(v);
  }
}
// dx = dy where x > 0, dy * (y + alpha) elsewhere
__global__ void elu_backward(const int n, const Dtype* dy, const Dtype* y, const Dtype* x, Dtype* dx,
                             const Dtype alpha) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = x[i] > 0 ? dy[i] : dy[i] * (y[i] + alpha); }
}

// ---- Swish: s = sigmoid(beta * x), y = x * s ---------------------------------------------------
__global__ void swish_forward(const int n, const Dtype* x, Dtype* s, Dtype* y, const Dtype beta) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype v = x[i];
    const Dtype sig = Dtype(0.5) * tanh(Dtype(0.5) * beta * v) + Dtype(0.5);
    s[i] = sig;
    y[i] = v * sig;
  }
}
// dx = dy * (beta * y + s * (1 - beta * y))
__global__ void swish_backward(const int n, const Dtype* dy, const Dtype* y, const Dtype* s, Dtype* dx,
                               const Dtype beta) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype by = beta * y[i];
    dx[i] = dy[i] * (by + s[i] * (Dtype(1) - by));
  }
}

// ---- Power: y = (shift + scale * x) ^ power ----------------------------------------------------
__global__ void power_forward(const int n, const Dtype* x, Dtype* y, const Dtype power,
                              const Dtype scale, const Dtype shift) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype v = shift + scale * x[i];
    y[i] = power == Dtype(1) ? v : (power == Dtype(2) ? v * v : pow(v, power));
  }
}
// Caffe's forms: power 1: dx = dy * scale; power 2: dx = dy * 2 * scale * (shift + scale * x);
// otherwise dx = dy * power * y / x when shift == 0, dy * power * scale * y / (shift + scale * x) else.
__global__ void power_backward(const int n, const Dtype* dy, const Dtype* x, const Dtype* y, Dtype* dx,
                               const Dtype power, const Dtype scale, const Dtype shift) {
  const Dtype diff_scale = power * scale;
  CUDA_KERNEL_LOOP(i, n) {
    Dtype d;
    if (power == Dtype(1)) {
      d = diff_scale;
    } else if (power == Dtype(2)) {
      d = diff_scale * shift + diff_scale * scale * x[i];
    } else if (shift == Dtype(0)) {
      d = power * y[i] / x[i];
    } else {
      d = diff_scale * y[i] / (shift + scale * x[i]);
    }
    dx[i] = dy[i] * d;
  }
}

// ---- Exp: y = outer_scale * exp(inner_scale * x) ----------------------------------------------
__global__ void exp_forward(const int n, const Dtype* x, Dtype* y, const Dtype inner_scale,
                            const Dtype outer_scale) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = outer_scale * exp(inner_scale * x[i]); }
}
// dx = dy * y * inner_scale (reads only the top)
__global__ void exp_backward(const int n, const Dtype* dy, const Dtype* y, Dtype* dx,
                             const Dtype inner_scale) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = dy[i] * y[i] * inner_scale; }
}

// ---- Log: y = base_scale * log(shift + scale * x) ---------------------------------------------
__global__ void log_forward(const int n, const Dtype* x, Dtype* y, const Dtype base_scale,
                            const Dtype scale, const Dtype shift) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = base_scale * log(shift + scale * x[i]); }
}
// dx = dy * (scale * base_scale) / (shift + scale * x)
__global__ void log_backward(const int n, const Dtype* dy, const Dtype* x, Dtype* dx,
                             const Dtype num_scale, const Dtype scale, const Dtype shift) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = dy[i] * num_scale / (shift + scale * x[i]); }
}

// ---- AbsVal: y = |x|, dx = sign(x) * dy (sign(0) = 0) ----------------------------------------
__global__ void absval_forward(const int n, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = fabs(x[i]); }
}
__global__ void absval_backward(const int n, const Dtype* dy, const Dtype* x, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype v = x[i];
    dx[i] = dy[i] * Dtype((Dtype(0) < v) - (v < Dtype(0)));
  }
}

// ---- BNLL: y = log(1 + exp(x)) in the overflow-free form ---------------------------------------
__global__ void bnll_forward(const int n, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype v = x[i];
    y[i] = v > 0 ? v + log1p(exp(-v)) : log1p(exp(v));
  }
}
// dx = dy * sigmoid(x), with exp's argument capped at 50 as Caffe does
__global__ void bnll_backward(const int n, const Dtype* dy, const Dtype* x, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype e = exp(fmin(x[i], Dtype(50)));
    dx[i] = dy[i] * e / (e + Dtype(1));
  }
}

// ---- Threshold: y = x > t ? 1 : 0 --------------------------------------------------------------
__global__ void threshold_forward(const int n, const Dtype* x, Dtype* y, const Dtype t) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] > t ? Dtype(1) : Dtype(0); }
}

// ---- Clip: y = max(lo, min(x, hi)); dx = dy where lo <= x <= hi -------------------------------
__global__ void clip_forward(const int n, const Dtype* x, Dtype* y, const Dtype lo, const Dtype hi) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype upper = x[i] > hi ? hi : x[i];
    y[i] = upper < lo ? lo : upper;
  }
}
__global__ void clip_backward(const int n, const Dtype* dy, const Dtype* x, Dtype* dx, const Dtype lo,
                              const Dtype hi) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype v = x[i];
    dx[i] = (v >= lo && v <= hi) ? dy[i] : Dtype(0);
  }
}
