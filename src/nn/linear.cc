// Linear layer: out = inp @ weight^T + bias, as three gemm calls in backward.
#include "nn/layers.h"

#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "nn/check.h"
#include "tensor/gemm.h"

namespace zerodp {

using nn_detail::check_count;
using nn_detail::check_optional_count;
using nn_detail::check_size;

void linear_forward(GemmResult out, GemmOperand inp, std::span<const float> weight,
                    std::span<const float> bias, size_t rows, size_t C, size_t OC,
                    GemmCompute compute) {
  const std::string shape = fmt::format("(rows={}, C={}, OC={})", rows, C, OC);
  check_size("linear_forward", "out", out.size(), rows * OC, shape);
  check_size("linear_forward", "inp", inp.size(), rows * C, shape);
  check_count("linear_forward", "weight", weight, OC * C, shape);
  check_optional_count("linear_forward", "bias", bias, OC, shape);
  // out (rows, OC) = inp (rows, C) @ weight^T (C, OC) + bias, the bias added inside the
  // product's tiles (tensor/gemm.h).
  gemm(compute, Transpose::kNo, Transpose::kYes, rows, OC, C, 1.0f, inp, C, weight, C, 0.0f, out,
       OC, bias);
}

void linear_backward(std::span<float> dinp, std::span<float> dweight, std::span<float> dbias,
                     GemmOperand dout, GemmOperand inp, std::span<const float> weight, size_t rows,
                     size_t C, size_t OC, GemmCompute compute, InputGrad dinp_mode) {
  const std::string shape = fmt::format("(rows={}, C={}, OC={})", rows, C, OC);
  check_optional_count("linear_backward", "dinp", dinp, rows * C, shape);
  check_count("linear_backward", "dweight", dweight, OC * C, shape);
  check_optional_count("linear_backward", "dbias", dbias, OC, shape);
  check_size("linear_backward", "dout", dout.size(), rows * OC, shape);
  if (dout.is_bf16() && !dbias.empty()) {
    throw InvalidArgument(fmt::format(
        "linear_backward: dout is bf16 and dbias is given {}; a bf16 dout's bias gradient is "
        "summed from its fp32 values by whoever rounded it (gelu_backward_bf16): pass no dbias",
        shape));
  }
  check_size("linear_backward", "inp", inp.size(), rows * C, shape);
  check_count("linear_backward", "weight", weight, OC * C, shape);
  // Both products read dout: with bf16 compute, round it once (unless it comes rounded).
  const Bf16Operands dout16(compute,
                            dinp.empty() || dout.is_bf16() ? std::span<const float>() : dout.f32());
  // dinp (rows, C) += (or =) dout (rows, OC) @ weight (OC, C)
  if (!dinp.empty()) {
    const float beta = dinp_mode == InputGrad::kAdd ? 1.0f : 0.0f;
    gemm(compute, Transpose::kNo, Transpose::kNo, rows, C, OC, 1.0f, dout, OC, weight, C, beta,
         dinp, C);
  }
  // dweight (OC, C) += dout^T (OC, rows) @ inp (rows, C)
  gemm(compute, Transpose::kYes, Transpose::kNo, OC, C, rows, 1.0f, dout, OC, inp, C, 1.0f, dweight,
       C);
  // dbias (OC) += sum over rows of dout, row by row: vectorizes across OC, fixed order.
  if (!dbias.empty()) {
    for (size_t r = 0; r < rows; ++r) {
      const float* dout_r = dout.f32().data() + r * OC;
      for (size_t o = 0; o < OC; ++o) dbias[o] += dout_r[o];
    }
  }
}

std::vector<GemmShape> linear_products(size_t rows, size_t C, size_t OC, bool input_grad) {
  std::vector<GemmShape> p{{Transpose::kNo, Transpose::kYes, rows, OC, C}};
  if (input_grad) p.push_back({Transpose::kNo, Transpose::kNo, rows, C, OC});
  p.push_back({Transpose::kYes, Transpose::kNo, OC, C, rows});
  return p;
}

}  // namespace zerodp
