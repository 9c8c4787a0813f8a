#include "kiln/model/arch/registry.h"

#include <array>

namespace kiln::model {
namespace {

const std::array<const ArchDef*, 13> kArchs = {
    &kArchLlama,  &kArchQwen2,     &kArchQwen3,    &kArchQwen3Moe, &kArchGemma2,
    &kArchGemma3, &kArchPhi3,      &kArchMistral3, &kArchBert,     &kArchNomicBert,
    &kArchQwen35, &kArchQwen35Moe, &kArchQwen3Next};

}  // namespace

const ArchDef* find_arch(std::string_view name) {
  for (const ArchDef* a : kArchs) {
    if (a->name == name) return a;
  }
  return nullptr;
}

std::vector<std::string_view> arch_names() {
  std::vector<std::string_view> out;
  for (const ArchDef* a : kArchs) out.push_back(a->name);
  return out;
}

}  // namespace kiln::model
