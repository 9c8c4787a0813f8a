// The registered architectures (one definition per file in this folder).
#pragma once

#include "kiln/model/arch/arch.h"

namespace kiln::model {

extern const ArchDef kArchLlama;
extern const ArchDef kArchQwen2;
extern const ArchDef kArchQwen3;
extern const ArchDef kArchQwen3Moe;
extern const ArchDef kArchGemma2;
extern const ArchDef kArchGemma3;
extern const ArchDef kArchPhi3;
extern const ArchDef kArchMistral3;
extern const ArchDef kArchBert;
extern const ArchDef kArchNomicBert;

}  // namespace kiln::model
