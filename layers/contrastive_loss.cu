// ContrastiveLoss on feature pairs a, b (num, channels) and num similarity labels.
// Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude; math in Mtype.

#define CONTRASTIVE_EPSILON 1e-4

// Per pair n: diff_n = a_n - b_n, dist_sq[n] = ||diff_n||^2 and loss[n] = dist_sq (similar),
// max(margin - dist_sq, 0) (legacy) or max(margin - sqrt(dist_sq), 0)^2 (dissimilar).
__global__ void contrastive_forward(const int num, const int channels, const Dtype* a, const Dtype* b,
                                    const Dtype* y, const Mtype margin, const int legacy, Dtype* diff,
                                    Dtype* dist_sq, Dtype* loss) {
  CUDA_KERNEL_LOOP(n, num) {
    Mtype s = 0;
    for (int c = 0; c < channels; ++c) {
      const int i = n * channels + c;
      const Mtype v = to_m(a[i]) - to_m(b[i]);
      diff[i] = from_m(v);
      s += v * v;
    }
    dist_sq[n] = from_m(s);
    if (static_cast<int>(to_m(y[n])) != 0) {
      loss[n] = from_m(s);
    } else if (legacy) {
      loss[n] = from_m(max(Mtype(margin) - s, Mtype(0)));
    } else {
      const Mtype m = max(Mtype(margin) - sqrt(s), Mtype(0));
      loss[n] = from_m(m * m);
    }
  }
}

// dx[n, c] = alpha*diff (similar); for dissimilar pairs with a positive margin term -alpha*diff
// (legacy) or -alpha*(margin - d)/(d + 1e-4)*diff; 0 otherwise. alpha = sign * top_diff[0] / norm[0].
__global__ void contrastive_backward(const int count, const int channels, const Dtype* diff,
                                     const Dtype* dist_sq, const Dtype* y, const Mtype margin,
                                     const int legacy, const Mtype sign, const Dtype* top_diff,
                                     const Dtype* norm, Dtype* dx) {
  const Mtype alpha = Mtype(sign) * to_m(top_diff[0]) / to_m(norm[0]);
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / channels;
    if (static_cast<int>(to_m(y[n])) != 0) {
      dx[i] = from_m(alpha * to_m(diff[i]));
    } else {
      Mtype mdist, beta;
      if (legacy) {
        mdist = Mtype(margin) - to_m(dist_sq[n]);
        beta = -alpha;
      } else {
        const Mtype dist = sqrt(to_m(dist_sq[n]));
        mdist = Mtype(margin) - dist;
        beta = -alpha * mdist / (dist + Mtype(CONTRASTIVE_EPSILON));
      }
      dx[i] = from_m(mdist > Mtype(0) ? beta * to_m(diff[i]) : Mtype(0));
    }
  }
}
