#pragma once
// Umbrella header: Variable, grad mode, tapes, Function<T> and every op.
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/leaf_final.h"
#include "autograd/ops.h"
#include "autograd/tape.h"
#include "autograd/variable.h"
