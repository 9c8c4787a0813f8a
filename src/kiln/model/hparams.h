// Hyperparameters <-> GGUF metadata. The key names are llama.cpp's (`<arch>.block_count`, ...)
// and live only here.
#pragma once

#include "kiln/gguf/gguf.h"
#include "kiln/gguf/writer.h"
#include "kiln/model/arch/arch.h"
#include "kiln/util/status.h"

namespace kiln::model {

// Reads general.architecture and the `<arch>.*` keys; fills defaults the way llama.cpp does
// (head dims from n_embd / n_head, n_head_kv = n_head, n_rot = head_dim_k). Vocabulary size
// from `<arch>.vocab_size` or the token list. Checks the values are consistent.
Expected<HParams> read_hparams(const gguf::File& file);

// Writes general.architecture and the `<arch>.*` keys of `hp`.
void write_hparams(gguf::Writer& w, const HParams& hp);

// Checks every tensor of the architecture's manifest against the file: present when required,
// shape and type allowed. Extra tensors are an error too (a file for another architecture).
Status check_manifest(const gguf::File& file, const ArchDef& arch, const HParams& hp);

}  // namespace kiln::model
