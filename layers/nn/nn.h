#pragma once
// Umbrella header: every layer.
#include "layers/nn/activation.h"
#include "layers/nn/attention.h"
#include "layers/nn/conv.h"
#include "layers/nn/embedding.h"
#include "layers/nn/init.h"
#include "layers/nn/linear.h"
#include "layers/nn/norm.h"
#include "layers/nn/sequential.h"
#include "layers/nn/transformer.h"
