// Whole-model helpers over a Model (an ordered list of units): the parameter count, and a
// plain sequential fp32 forward + backward with freshly allocated buffers.
//
// The reference pass is what the engine's stages must reproduce: no sharding, no 16-bit
// rounding, no overlap. It allocates every unit's activations, saved state and scratch at
// once, so it is for tests, tools and small models, not for training large ones.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "models/unit.h"

namespace zerodp {

// Builds a model of the caller's own: called once per rank by the engine, which then
// needs nothing else of it (train/engine.h says what data it must consume).
using ModelFactory = std::function<Model()>;

// Sum of the units' numel (Φ).
size_t parameter_count(const Model& model);

// The distinct products of every unit for a micro-batch of shape `s` (Unit::products);
// empty when no unit declares any.
std::vector<GemmShape> model_products(const Model& model, const BatchShape& s);

// Runs every unit's forward in order, then (when `grads` is not empty) every unit's
// backward in reverse order, and returns the last unit's output, the micro-batch's loss.
// weights[u] is unit u's flat buffer (numel elements); gradients are ADDED (+=) into
// grads[u] (numel elements, the caller zeroes them), seeded with mb.loss_grad_scale as the
// head's backward does. Throws InvalidArgument when the counts do not match the model or
// the last unit does not output one element.
float model_loss_and_grads(const Model& model, std::span<const std::vector<float>> weights,
                           const MicroBatch& mb, std::span<std::vector<float>> grads);

// The forward half alone.
inline float model_loss(const Model& model, std::span<const std::vector<float>> weights,
                        const MicroBatch& mb) {
  return model_loss_and_grads(model, weights, mb, {});
}

}  // namespace zerodp
