// The data layers' device transform: a batch of uint8 (C, H, W) items (raw or decoded Datums, uploaded as bytes) transformed as
// DataTransformer.apply does on the host, into Dtype (num, C, out_h, out_w): crop at the item's row and
// column offsets, subtract the mean, multiply by scale, flip left-right when the item's mirror flag is
// set. The same float operations in the same order as the host, so the pixels are identical.
// draws: (num, 3) ints per item: row offset, column offset, mirror flag.
// mean_kind 0: no mean; 1: mean[c] per channel; 2: mean_file values of the uncropped item, (C, H, W).

__global__ void data_transform_u8(const int n, const unsigned char* src, const int* draws, const Dtype* mean,
                                  const int mean_kind, const int use_scale, const Dtype scale,
                                  const int channels, const int height, const int width, const int out_h,
                                  const int out_w, Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) {
    const int x = i % out_w;
    const int y = (i / out_w) % out_h;
    const int c = (i / out_w / out_h) % channels;
    const int item = i / out_w / out_h / channels;
    const int* d = draws + 3 * item;
    const int sy = y + d[0];
    const int sx = (d[2] ? out_w - 1 - x : x) + d[1];
    const long long pixel = ((long long)c * height + sy) * width + sx;
    Dtype v = (Dtype)src[(long long)item * channels * height * width + pixel];
    if (mean_kind == 1) {
      v -= mean[c];
    } else if (mean_kind == 2) {
      v -= mean[pixel];
    }
    if (use_scale) {
      v *= scale;
    }
    out[i] = v;
  }
}
