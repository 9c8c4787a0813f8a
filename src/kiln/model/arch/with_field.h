// Resolving a manifest entry's field (TensorSpec::field) to the member it names: the loader
// binds tensors through it and the forward prepares them through it.
#pragma once

#include <cstdint>
#include <type_traits>
#include <variant>
#include <vector>

#include "kiln/model/arch/arch.h"
#include "kiln/util/status.h"

namespace kiln::model {

// The field `spec` is bound to, in layers[spec.layer] or `model`, handed to on_weight
// (backend::Weight&) or on_vector (const float*&), each returning a Status; OK without a call
// for a spec bound to no field. An error for a layer past `layers`.
template <typename OnWeight, typename OnVector>
Status with_field(const TensorSpec& spec, std::vector<LayerWeights>& layers, ModelWeights& model,
                  OnWeight&& on_weight, OnVector&& on_vector) {
  if (spec.layer >= static_cast<int32_t>(layers.size()))
    return err("model: tensor '{}' of layer {} past the {} layers", spec.name, spec.layer,
               layers.size());
  LayerWeights* layer = spec.layer >= 0 ? &layers[static_cast<size_t>(spec.layer)] : nullptr;
  return std::visit(
      [&](auto field) -> Status {
        using F = decltype(field);
        if constexpr (std::is_same_v<F, std::monostate>) {
          return {};
        } else if constexpr (std::is_same_v<F, backend::Weight LayerWeights::*>) {
          return on_weight(layer->*field);
        } else if constexpr (std::is_same_v<F, backend::Weight ModelWeights::*>) {
          return on_weight(model.*field);
        } else if constexpr (std::is_same_v<F, const float * LayerWeights::*>) {
          return on_vector(layer->*field);
        } else {
          return on_vector(model.*field);
        }
      },
      spec.field);
}

}  // namespace kiln::model
