// Every op schema of the exogym library. Kernels register per device in cpu/ and cuda/.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// The module exists so that `import exogym._C` loads this library and runs the registrations
// below; it has no Python functions (ops are reached through torch.ops.exogym).
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(exogym, m) {
  // k = out.numel() indices out of n, drawn from (seed, step, tensor_id); sorted ascending.
  m.def("select_indices(int n, int seed, int step, int tensor_id, Tensor(a!) out) -> ()");
  // Concatenate src_i.flatten()[indices_i] for every i into one contiguous 1-D tensor.
  m.def("sparse_gather(Tensor[] srcs, Tensor[] indices) -> Tensor");
  // dst_i.flatten()[indices_i] = values[offset_i : offset_i + len(indices_i)] * scale, in place.
  m.def("sparse_scatter_(Tensor(a!)[] dsts, Tensor[] indices, Tensor values, float scale) -> ()");
  // Chunked orthonormal 2-D DCT-II of x [rows, cols] in cr x cc chunks; the k largest-magnitude
  // coefficients per chunk as (indices [chunks, k] int16/int32 sorted, values [chunks, k]).
  m.def("dct_encode(Tensor x, int cr, int cc, int k) -> (Tensor, Tensor)");
  // Mean over ranks of gathered top-k ([ranks, chunks, k]) per coefficient, inverse DCT -> [rows, cols].
  m.def("dct_decode(Tensor indices, Tensor values, int rows, int cols, int cr, int cc, bool sign) -> Tensor");
  // Shared-memory barrier: publish (gen, tag, group, size) in flags[rank] with release order, wait
  // (acquire) until every rank reached gen, spinning for spin_us then sleeping.
  // -1: passed; -2: timed out; r >= 0: rank r disagreed.
  m.def("shm_barrier(Tensor(a!) flags, int rank, int gen, int tag, int group, int size, float timeout_s, "
        "int spin_us) -> int");
}
