// The `mlp` model for Fashion-MNIST: a multilayer perceptron as an ordered list of units.
//
//   "layers.{i}"  Linear + GELU: layers.{i}.weight (hidden, in), layers.{i}.bias (hidden),
//                 in = inputs for i = 0, hidden after; one unit per hidden layer
//   "head"        Linear to the classes + softmax cross-entropy: head.weight (classes, in),
//                 head.bias (classes) -> the mean loss over the micro-batch (1 element)
//
// Inputs come from mb.features (B, inputs), labels from mb.targets (B); mb.shape.T is 1. The
// first unit reads the micro-batch (input_count 0); with hidden_layers = 0 the model is
// the head alone (multinomial logistic regression). Names as a PyTorch module with a
// ModuleList `layers` and a Linear `head` would have them.
// Init: weights N(0, 1/sqrt(fan_in)) (LeCun normal; the scale of PyTorch's default Linear
// init, which is uniform), biases 0. Weight decay on weights, off for biases.
#pragma once

#include "models/unit.h"

namespace zerodp {

struct MlpConfig {
  int inputs = 784;  // 28 x 28 pixels
  int hidden = 256;  // width of every hidden layer
  int hidden_layers = 2;
  int classes = 10;
};

// Throws InvalidArgument naming the field, its value and what would work.
void validate(const MlpConfig& config);

// Validates `config` and builds its units (specs only: no weights are allocated).
Model make_mlp(const MlpConfig& config);

}  // namespace zerodp
