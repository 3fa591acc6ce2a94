// ContrastiveLoss on feature pairs a, b (num, channels) and num similarity labels.
// Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

#define CONTRASTIVE_EPSILON 1e-4

// Per pair n: diff_n = a_n - b_n, dist_sq[n] = ||diff_n||^2 and loss[n] = dist_sq (similar),
// max(margin - dist_sq, 0) (legacy) or max(margin - sqrt(dist_sq), 0)^2 (dissimilar).
__global__ void contrastive_forward(const int num, const int channels, const Dtype* a, const Dtype* b,
                                    const Dtype* y, const Dtype margin, const int legacy, Dtype* diff,
                                    Dtype* dist_sq, Dtype* loss) {
  CUDA_KERNEL_LOOP(n, num) {
    Dtype s = 0;
    for (int c = 0; c < channels; ++c) {
      const int i = n * channels + c;
      const Dtype v = a[i] - b[i];
      diff[i] = v;
      s += v * v;
    }
    dist_sq[n] = s;
    if (static_cast<int>(y[n]) != 0) {
      loss[n] = s;
    } else if (legacy) {
      loss[n] = max(margin - s, Dtype(0));
    } else {
      const Dtype m = max(margin - sqrt(s), Dtype(0));
      loss[n] = m * m;
    }
  }
}

// dx[n, c] = alpha*diff (similar); for dissimilar pairs with a positive margin term -alpha*diff
// (legacy) or -alpha*(margin - d)/(d + 1e-4)*diff; 0 otherwise. alpha = sign * top_diff[0] / norm[0].
__global__ void contrastive_backward(const int count, const int channels, const Dtype* diff,
                                     const Dtype* dist_sq, const Dtype* y, const Dtype margin,
                                     const int legacy, const Dtype sign, const Dtype* top_diff,
                                     const Dtype* norm, Dtype* dx) {
  const Dtype alpha = sign * top_diff[0] / norm[0];
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / channels;
    if (static_cast<int>(y[n]) != 0) {
      dx[i] = alpha * diff[i];
    } else {
      Dtype mdist, beta;
      if (legacy) {
        mdist = margin - dist_sq[n];
        beta = -alpha;
      } else {
        const Dtype dist = sqrt(dist_sq[n]);
        mdist = margin - dist;
        beta = -alpha * mdist / (dist + Dtype(CONTRASTIVE_EPSILON));
      }
      dx[i] = mdist > Dtype(0) ? beta * diff[i] : Dtype(0);
    }
  }
}
