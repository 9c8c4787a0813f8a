#include "kiln/util/cpu.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace kiln::util {
namespace {

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// Implications cpu.h promises; checked on every CpuFeatures we produce.
void expect_consistent(const CpuFeatures& f) {
  for (bool sub : {f.avx2, f.fma, f.f16c, f.avx_vnni}) EXPECT_TRUE(!sub || f.avx);
  for (bool sub : {f.avx512dq, f.avx512bw, f.avx512vl, f.avx512vbmi, f.avx512vnni, f.avx512bf16,
                   f.avx512fp16}) {
    EXPECT_TRUE(!sub || f.avx512f);
  }
  EXPECT_TRUE(!f.avx512f || (f.avx2 && f.fma));
  EXPECT_TRUE(!f.amx_int8 || f.amx_tile);
  EXPECT_TRUE(!f.amx_bf16 || f.amx_tile);
  for (bool sub : {f.arm_dotprod, f.arm_fp16, f.arm_i8mm}) EXPECT_TRUE(!sub || f.neon);
}

TEST(CpuFeatures, DetectedFeaturesAreConsistent) {
  const CpuFeatures& f = cpu_features();
  expect_consistent(f);
  EXPECT_EQ(&f, &cpu_features());  // detected once
#if defined(__x86_64__)
  EXPECT_FALSE(f.neon);
  EXPECT_TRUE(f.sse3);  // every x86-64 CPU of the last 15 years
#elif defined(__aarch64__)
  EXPECT_TRUE(f.neon);  // mandatory in ARMv8-A
  EXPECT_FALSE(f.avx);
#endif
  std::printf("cpu features: %s\n", to_string(f).c_str());
  std::printf("cores: %d logical, %d available, %d physical\n", num_logical_cores(),
              num_available_cores(), num_physical_cores());
}

TEST(CpuFeatures, ToStringOfHandMadeSets) {
  CpuFeatures f;
  EXPECT_EQ(to_string(f), "");
  f.avx2 = true;
  EXPECT_EQ(to_string(f), "AVX2");
  f.fma = true;
  f.avx = true;
  f.f16c = true;
  EXPECT_EQ(to_string(f), "AVX AVX2 FMA F16C");
  f.avx512f = true;
  f.avx512vnni = true;
  f.avx512bf16 = true;
  EXPECT_EQ(to_string(f), "AVX AVX2 FMA F16C AVX512F AVX512_VNNI AVX512_BF16");
  CpuFeatures arm;
  arm.neon = true;
  arm.arm_dotprod = true;
  arm.arm_fp16 = true;
  EXPECT_EQ(to_string(arm), "NEON ARM_DOTPROD ARM_FP16");
}

TEST(CpuFeatures, ToStringOfAllFlags) {
  CpuFeatures f;
  for (const CpuFlagName& flag : cpu_flag_names()) f.*flag.member = true;
  EXPECT_EQ(to_string(f),
            "SSE3 SSSE3 SSE4_1 SSE4_2 AVX AVX2 FMA F16C BMI2 AVX512F AVX512DQ AVX512BW AVX512VL "
            "AVX512_VBMI AVX512_VNNI AVX512_BF16 AVX512_FP16 AVX_VNNI AMX_TILE AMX_INT8 "
            "AMX_BF16 NEON ARM_DOTPROD ARM_FP16 ARM_I8MM ARM_SVE");
  // The table names every bool of the struct exactly once.
  EXPECT_EQ(cpu_flag_names().size() * sizeof(bool), sizeof(CpuFeatures));
  const auto names = cpu_flag_names();
  for (size_t i = 0; i < names.size(); ++i) {
    for (size_t j = i + 1; j < names.size(); ++j) {
      EXPECT_NE(names[i].member, names[j].member) << names[i].name << " " << names[j].name;
      EXPECT_STRNE(names[i].name, names[j].name);
    }
  }
}

TEST(CpuFeatures, ToStringListsExactlyTheTrueFlags) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    CpuFeatures f;
    std::vector<std::string> expected;
    for (const CpuFlagName& flag : cpu_flag_names()) {
      const bool on = (rng() & 1) != 0;
      f.*flag.member = on;
      if (on) expected.push_back(flag.name);
    }
    EXPECT_EQ(split_words(to_string(f)), expected);
  }
  // And for this machine's features.
  std::vector<std::string> expected;
  for (const CpuFlagName& flag : cpu_flag_names()) {
    if (cpu_features().*flag.member) expected.push_back(flag.name);
  }
  EXPECT_EQ(split_words(to_string(cpu_features())), expected);
}

// Register values of a Sapphire Rapids class CPU (AVX-512 with VNNI, BF16, FP16, AMX) with
// the OS saving every state component.
X86CpuidRegs sapphire_rapids_like() {
  X86CpuidRegs r;
  r.max_leaf = 0x20;
  r.leaf1_ecx = (1u << 0) | (1u << 9) | (1u << 12) | (1u << 19) | (1u << 20) | (1u << 27) |
                (1u << 28) | (1u << 29);
  r.leaf7_max_sub = 1;
  r.leaf7_ebx = (1u << 5) | (1u << 8) | (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
  r.leaf7_ecx = (1u << 1) | (1u << 11);
  r.leaf7_edx = (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25);
  r.leaf7_1_eax = (1u << 4) | (1u << 5);
  r.xcr0 = 0x600e7;  // x87 SSE AVX opmask ZMM_Hi256 Hi16_ZMM XTILECFG XTILEDATA
  return r;
}

TEST(CpuFeatures, DecodeX86FullSupport) {
  const CpuFeatures f = decode_x86_features(sapphire_rapids_like());
  expect_consistent(f);
  EXPECT_EQ(to_string(f),
            "SSE3 SSSE3 SSE4_1 SSE4_2 AVX AVX2 FMA F16C BMI2 AVX512F AVX512DQ AVX512BW AVX512VL "
            "AVX512_VBMI AVX512_VNNI AVX512_BF16 AVX512_FP16 AVX_VNNI AMX_TILE AMX_INT8 "
            "AMX_BF16");
}

TEST(CpuFeatures, DecodeX86WithoutOsSupportReadsFalse) {
  // The OS did not enable XSAVE: no AVX of any kind, whatever the CPU says.
  X86CpuidRegs r = sapphire_rapids_like();
  r.leaf1_ecx &= ~(1u << 27);
  EXPECT_EQ(to_string(decode_x86_features(r)), "SSE3 SSSE3 SSE4_1 SSE4_2 BMI2");
  // XSAVE on but only x87+SSE state saved.
  r = sapphire_rapids_like();
  r.xcr0 = 0x3;
  EXPECT_EQ(to_string(decode_x86_features(r)), "SSE3 SSSE3 SSE4_1 SSE4_2 BMI2");
  // YMM saved but not ZMM/opmask (e.g. a kernel booted with AVX-512 disabled): AVX2 only.
  r.xcr0 = 0x7;
  EXPECT_EQ(to_string(decode_x86_features(r)),
            "SSE3 SSSE3 SSE4_1 SSE4_2 AVX AVX2 FMA F16C BMI2 AVX_VNNI");
  // ZMM saved but only the low half of the upper registers: still no AVX-512.
  r.xcr0 = 0x67;
  EXPECT_FALSE(decode_x86_features(r).avx512f);
  // Everything but the tile state: no AMX (Linux enables it only on request per process, but
  // XCR0 reports what the kernel supports).
  r.xcr0 = 0xe7;
  const CpuFeatures f = decode_x86_features(r);
  EXPECT_TRUE(f.avx512fp16);
  EXPECT_FALSE(f.amx_tile);
  EXPECT_FALSE(f.amx_int8);
  EXPECT_FALSE(f.amx_bf16);
}

TEST(CpuFeatures, DecodeX86RespectsMaxLeaves) {
  X86CpuidRegs r = sapphire_rapids_like();
  r.max_leaf = 6;  // leaf 7 values are stale garbage
  EXPECT_EQ(to_string(decode_x86_features(r)), "SSE3 SSSE3 SSE4_1 SSE4_2 AVX FMA F16C");
  r = sapphire_rapids_like();
  r.leaf7_max_sub = 0;  // no subleaf 1: no AVX_VNNI / AVX512_BF16
  const CpuFeatures f = decode_x86_features(r);
  EXPECT_FALSE(f.avx_vnni);
  EXPECT_FALSE(f.avx512bf16);
  EXPECT_TRUE(f.avx512vnni);
}

TEST(CpuFeatures, DecodeX86ImplicationsHoldForAnyBits) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    X86CpuidRegs r;
    r.max_leaf = rng() % 16;
    r.leaf1_ecx = rng();
    r.leaf7_max_sub = rng() % 3;
    r.leaf7_ebx = rng();
    r.leaf7_ecx = rng();
    r.leaf7_edx = rng();
    r.leaf7_1_eax = rng();
    r.xcr0 = (uint64_t{rng()} << 32) | rng();
    expect_consistent(decode_x86_features(r));
  }
}

TEST(CpuFeatures, DecodeArmHwcaps) {
  constexpr uint64_t kAsimd = 1u << 1, kFphp = 1u << 9, kAsimdhp = 1u << 10, kAsimddp = 1u << 20,
                     kSve = 1u << 22, kI8mm2 = 1u << 13;
  EXPECT_EQ(to_string(decode_arm_hwcaps(0, 0)), "");
  EXPECT_EQ(to_string(decode_arm_hwcaps(kAsimd | 1, 0)), "NEON");
  EXPECT_EQ(to_string(decode_arm_hwcaps(kAsimd | kFphp | kAsimdhp | kAsimddp | kSve, kI8mm2)),
            "NEON ARM_DOTPROD ARM_FP16 ARM_I8MM ARM_SVE");
  // fp16 needs both the scalar and the vector capability.
  EXPECT_FALSE(decode_arm_hwcaps(kAsimd | kAsimdhp, 0).arm_fp16);
  // Nothing SIMD without ASIMD.
  EXPECT_EQ(to_string(decode_arm_hwcaps(kAsimddp | kFphp | kAsimdhp, kI8mm2)), "");
}

// The first "flags" (x86) or "Features" (aarch64) line of /proc/cpuinfo, or empty.
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::vector<std::string> words = split_words(line.substr(colon + 1));
      return {words.begin(), words.end()};
    }
  }
  return {};
}

TEST(CpuFeatures, MatchesProcCpuinfo) {
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags here";
  const CpuFeatures& f = cpu_features();
  auto has = [&](const char* name) { return flags.count(name) == 1; };
#if defined(__x86_64__)
  const std::pair<const char*, bool> checks[] = {
      {"pni", f.sse3},  // the kernel's name for SSE3
      {"ssse3", f.ssse3},
      {"sse4_1", f.sse41},
      {"sse4_2", f.sse42},
      {"avx", f.avx},
      {"avx2", f.avx2},
      {"fma", f.fma},
      {"f16c", f.f16c},
      {"bmi2", f.bmi2},
      {"avx512f", f.avx512f},
      {"avx512dq", f.avx512dq},
      {"avx512bw", f.avx512bw},
      {"avx512vl", f.avx512vl},
      {"avx512vbmi", f.avx512vbmi},
      {"avx512_vnni", f.avx512vnni},
      {"avx512_bf16", f.avx512bf16},
      {"avx512_fp16", f.avx512fp16},
      {"avx_vnni", f.avx_vnni},
      {"amx_tile", f.amx_tile},
      {"amx_int8", f.amx_int8},
      {"amx_bf16", f.amx_bf16},
  };
#elif defined(__aarch64__)
  const std::pair<const char*, bool> checks[] = {
      {"asimd", f.neon},
      {"asimddp", f.arm_dotprod},
      {"i8mm", f.arm_i8mm},
      {"sve", f.arm_sve},
  };
  EXPECT_EQ(has("fphp") && has("asimdhp"), f.arm_fp16);
#else
  const std::pair<const char*, bool> checks[] = {{"", false}};
  GTEST_SKIP() << "no cpuinfo mapping for this architecture";
#endif
  for (const auto& [name, detected] : checks) {
    EXPECT_EQ(has(name), detected) << "cpuinfo flag " << name;
  }
}

// CPUs listed in /proc/self/status Cpus_allowed_list ("0-3,8"), or empty if unreadable.
std::set<int> allowed_cpus() {
  std::ifstream in("/proc/self/status");
  std::set<int> cpus;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Cpus_allowed_list:", 0) != 0) continue;
    std::istringstream list(line.substr(line.find(':') + 1));
    for (std::string part; std::getline(list, part, ',');) {
      const size_t dash = part.find('-');
      const int lo = std::stoi(part.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      for (int c = lo; c <= hi; ++c) cpus.insert(c);
    }
  }
  return cpus;
}

TEST(CpuCores, CountsAgreeWithProc) {
  EXPECT_GE(num_logical_cores(), 1);
  EXPECT_GE(num_available_cores(), 1);
  EXPECT_LE(num_available_cores(), num_logical_cores());
  EXPECT_GE(num_physical_cores(), 1);
  EXPECT_LE(num_physical_cores(), num_available_cores());

  const std::set<int> allowed = allowed_cpus();
  if (allowed.empty()) GTEST_SKIP() << "no /proc/self/status";
  EXPECT_EQ(num_available_cores(), static_cast<int>(allowed.size()));

  // Physical cores: distinct (physical id, core id) of the allowed processors in cpuinfo.
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<int, int>> cores;
  int processor = -1, package = -1;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_first_of("\t:"));
    const std::string value = line.substr(colon + 1);
    if (key == "processor") processor = std::stoi(value);
    if (key == "physical id") package = std::stoi(value);
    if (key == "core id" && allowed.count(processor) == 1) {
      cores.insert({package, std::stoi(value)});
    }
  }
  if (cores.empty()) GTEST_SKIP() << "no core ids in /proc/cpuinfo";
  EXPECT_EQ(num_physical_cores(), static_cast<int>(cores.size()));
}

}  // namespace
}  // namespace kiln::util
