// SSD box maths on the device (pycaffe_lite/bbox.py has the host twins and the semantics).
// Boxes are (xmin, ymin, xmax, ymax). Code types: 1 CORNER, 2 CENTER_SIZE, 3 CORNER_SIZE.
// Coordinates, areas and scores are compared and computed in Mtype (to_m / from_m: the prelude).
#define BBOX_THREADS 256

// Products rounded on their own (no fused multiply-add), so the device computes what the host's
// numpy code computes, operation by operation.
extern "C++" {
__device__ __forceinline__ float bbox_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double bbox_mul(double a, double b) { return __dmul_rn(a, b); }
}

// decoded[((img * L + c) * P + p) * 4 + k] from loc[((img * P + p) * L + c) * 4 + k];
// prior = [P*4 boxes | P*4 variances]. One thread per (img, prior, loc class).
__global__ void bbox_decode(const int n, const int num_priors, const int num_loc_classes,
                            const int code_type, const int variance_in_target, const Dtype* loc,
                            const Dtype* prior, Dtype* decoded) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = i % num_loc_classes;
    const int p = (i / num_loc_classes) % num_priors;
    const int img = i / (num_loc_classes * num_priors);
    const Dtype* pr = prior + p * 4;
    const Dtype* var = prior + num_priors * 4 + p * 4;
    const Dtype* t = loc + (size_t)i * 4;
    Mtype v[4];
    for (int k = 0; k < 4; ++k) {
      v[k] = variance_in_target ? to_m(t[k]) : bbox_mul(to_m(t[k]), to_m(var[k]));
    }
    Dtype* out = decoded + ((size_t)(img * num_loc_classes + c) * num_priors + p) * 4;
    const Mtype pw = to_m(pr[2]) - to_m(pr[0]);
    const Mtype ph = to_m(pr[3]) - to_m(pr[1]);
    if (code_type == 1) {
      for (int k = 0; k < 4; ++k) out[k] = from_m(to_m(pr[k]) + v[k]);
    } else if (code_type == 2) {
      const Mtype cx = bbox_mul(v[0], pw) + (to_m(pr[0]) + to_m(pr[2])) / 2;
      const Mtype cy = bbox_mul(v[1], ph) + (to_m(pr[1]) + to_m(pr[3])) / 2;
      // exponents capped as bbox.decode caps them (log(max)/2 - 1: w*h stays finite in Mtype)
      const Mtype cap = sizeof(Mtype) == 4 ? Mtype(43.36142) : Mtype(353.891356446692);
      const Mtype w = bbox_mul(exp(min(v[2], cap)), pw);
      const Mtype h = bbox_mul(exp(min(v[3], cap)), ph);
      out[0] = from_m(cx - w / 2);
      out[1] = from_m(cy - h / 2);
      out[2] = from_m(cx + w / 2);
      out[3] = from_m(cy + h / 2);
    } else {
      out[0] = from_m(to_m(pr[0]) + bbox_mul(v[0], pw));
      out[1] = from_m(to_m(pr[1]) + bbox_mul(v[1], ph));
      out[2] = from_m(to_m(pr[2]) + bbox_mul(v[2], pw));
      out[3] = from_m(to_m(pr[3]) + bbox_mul(v[3], ph));
    }
  }
}

__device__ Mtype bbox_iou(const Dtype* a, const Dtype* b) {
  const Mtype iw = min(to_m(a[2]), to_m(b[2])) - max(to_m(a[0]), to_m(b[0]));
  const Mtype ih = min(to_m(a[3]), to_m(b[3])) - max(to_m(a[1]), to_m(b[1]));
  if (!(iw > 0 && ih > 0)) return 0;
  const Mtype inter = bbox_mul(iw, ih);
  const Mtype wa = to_m(a[2]) - to_m(a[0]), ha = to_m(a[3]) - to_m(a[1]), wb = to_m(b[2]) - to_m(b[0]),
              hb = to_m(b[3]) - to_m(b[1]);
  const Mtype sa = (wa < 0 || ha < 0) ? Mtype(0) : bbox_mul(wa, ha);
  const Mtype sb = (wb < 0 || hb < 0) ? Mtype(0) : bbox_mul(wb, hb);
  return inter / (sa + sb - inter);
}

// One block per (image, class): candidates with score > score_threshold, ordered by score
// (descending, ties by prior index), cut to top_k, then greedy NMS with the adaptive threshold.
// kept[(img * C + c) * P + m] = prior index of the m-th kept box, kept_count[img * C + c] = count.
__global__ void bbox_nms(const int num_priors, const int num_classes, const int num_loc_classes,
                         const int background, const Mtype score_threshold, const float nms_threshold,
                         const float eta, const int top_k, const Dtype* decoded, const Dtype* conf,
                         int* cand, int* kept, int* kept_count) {
  __shared__ int s_count;
  __shared__ int s_suppressed;
  __shared__ float s_thr;
  const int img = blockIdx.x / num_classes;
  const int c = blockIdx.x % num_classes;
  const size_t base = (size_t)blockIdx.x * num_priors;
  if (threadIdx.x == 0) s_count = 0;
  __syncthreads();
  if (c == background) {
    if (threadIdx.x == 0) kept_count[blockIdx.x] = 0;
    return;
  }
  const Dtype* score = conf + (size_t)img * num_priors * num_classes + c;  // score(p) = score[p * C]
  for (int p = threadIdx.x; p < num_priors; p += blockDim.x) {
    if (to_m(score[(size_t)p * num_classes]) > Mtype(score_threshold)) {
      cand[base + atomicAdd(&s_count, 1)] = p;
    }
  }
  __syncthreads();
  const int total = s_count;
  // rank sort into kept[] (stable descending by score)
  for (int k = threadIdx.x; k < total; k += blockDim.x) {
    const int pk = cand[base + k];
    const Mtype sk = to_m(score[(size_t)pk * num_classes]);
    int rank = 0;
    for (int j = 0; j < total; ++j) {
      const int pj = cand[base + j];
      const Mtype sj = to_m(score[(size_t)pj * num_classes]);
      rank += (sj > sk || (sj == sk && pj < pk)) ? 1 : 0;
    }
    kept[base + rank] = pk;
  }
  __syncthreads();
  const int num = (top_k > -1 && top_k < total) ? top_k : total;
  const Dtype* boxes = decoded + (size_t)(img * num_loc_classes + (num_loc_classes == 1 ? 0 : c)) * num_priors * 4;
  int m = 0;  // kept so far (the same in every thread)
  if (threadIdx.x == 0) s_thr = nms_threshold;
  __syncthreads();
  for (int k = 0; k < num; ++k) {
    const int pk = kept[base + k];  // read before this iteration can overwrite position m <= k
    if (threadIdx.x == 0) s_suppressed = 0;
    __syncthreads();
    const float thr = s_thr;
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
      if (bbox_iou(boxes + (size_t)pk * 4, boxes + (size_t)kept[base + j] * 4) > thr) s_suppressed = 1;
    }
    __syncthreads();
    const bool keep = s_suppressed == 0;
    __syncthreads();
    if (keep) {
      if (threadIdx.x == 0) {
        kept[base + m] = pk;
        if (eta < 1.f && s_thr > 0.5f) s_thr = s_thr * eta;
      }
      ++m;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) kept_count[blockIdx.x] = m;
}

// One block per image: mark the kept boxes that survive keep_top_k (all when keep_top_k < 0 or
// the image has at most keep_top_k). Order: score descending, ties by class then NMS position.
// mask[(img * C + c) * P + m] = 1 for a surviving m-th kept box of class c; sel_count[img * C + c].
// offsets (C + 1 ints per image), ent_score / ent_key (C * P per image) are scratch.
__global__ void bbox_keep_top_k(const int num_priors, const int num_classes, const int keep_top_k,
                                const Dtype* conf, const int* kept, const int* kept_count, int* offsets,
                                Dtype* ent_score, int* ent_key, int* mask, int* sel_count) {
  const int img = blockIdx.x;
  int* off = offsets + (size_t)img * (num_classes + 1);
  const size_t base = (size_t)img * num_classes * num_priors;
  if (threadIdx.x == 0) {
    off[0] = 0;
    for (int c = 0; c < num_classes; ++c) off[c + 1] = off[c] + kept_count[img * num_classes + c];
  }
  for (int c = threadIdx.x; c < num_classes; c += blockDim.x) sel_count[img * num_classes + c] = 0;
  __syncthreads();
  const int total = off[num_classes];
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    int lo = 0, hi = num_classes - 1;  // the class c with off[c] <= e < off[c + 1]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (off[mid] <= e) lo = mid; else hi = mid - 1;
    }
    const int m = e - off[lo];
    const int p = kept[base + (size_t)lo * num_priors + m];
    ent_score[base + e] = conf[((size_t)img * num_priors + p) * num_classes + lo];
    ent_key[base + e] = lo * num_priors + m;
  }
  __syncthreads();
  const bool all = keep_top_k < 0 || total <= keep_top_k;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    const int key = ent_key[base + e];
    bool sel = all;
    if (!all) {
      const Mtype s = to_m(ent_score[base + e]);
      int rank = 0;
      for (int j = 0; j < total && rank < keep_top_k; ++j) {
        const Mtype sj = to_m(ent_score[base + j]);
        rank += (sj > s || (sj == s && ent_key[base + j] < key)) ? 1 : 0;
      }
      sel = rank < keep_top_k;
    }
    const int c = key / num_priors;
    mask[base + key] = sel ? 1 : 0;
    if (sel) atomicAdd(&sel_count[img * num_classes + c], 1);
  }
}

// One block (one thread) per (image, class): its surviving boxes as rows
// [image, class, score, xmin, ymin, xmax, ymax] from row row_offset[img * C + c], in NMS order.
__global__ void bbox_write_rows(const int num_priors, const int num_classes, const int num_loc_classes,
                                const Dtype* decoded, const Dtype* conf, const int* kept,
                                const int* kept_count, const int* mask, const int* row_offset, Dtype* top) {
  if (threadIdx.x != 0) return;
  const int img = blockIdx.x / num_classes;
  const int c = blockIdx.x % num_classes;
  const size_t base = (size_t)blockIdx.x * num_priors;
  const Dtype* boxes = decoded + (size_t)(img * num_loc_classes + (num_loc_classes == 1 ? 0 : c)) * num_priors * 4;
  Dtype* row = top + (size_t)row_offset[blockIdx.x] * 7;
  const int count = kept_count[blockIdx.x];
  for (int m = 0; m < count; ++m) {
    if (!mask[base + m]) continue;
    const int p = kept[base + m];
    row[0] = from_m(Mtype(img));
    row[1] = from_m(Mtype(c));
    row[2] = conf[((size_t)img * num_priors + p) * num_classes + c];
    for (int k = 0; k < 4; ++k) row[3 + k] = boxes[(size_t)p * 4 + k];
    row += 7;
  }
}
