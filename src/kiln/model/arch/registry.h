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
// arch/qwen35.cpp: the hybrid family, one manifest.
extern const ArchDef kArchQwen35;
extern const ArchDef kArchQwen35Moe;
extern const ArchDef kArchQwen3Next;

}  // namespace kiln::model
