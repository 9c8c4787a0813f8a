#include "kiln/util/cpu.h"

#include <cstdio>
#include <set>
#include <string>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#include <sys/auxv.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln::util {
namespace {

constexpr bool bit(uint64_t word, int b) {
  return ((word >> b) & 1) != 0;
}

// x86 cpuid bit positions (Intel SDM vol. 2A, CPUID; AMD APM vol. 3, appendix E).
namespace x86 {
// leaf 1 ECX
constexpr int kSse3 = 0, kSsse3 = 9, kFma = 12, kSse41 = 19, kSse42 = 20, kOsxsave = 27, kAvx = 28,
              kF16c = 29;
// leaf 7 subleaf 0 EBX
constexpr int kAvx2 = 5, kBmi2 = 8, kAvx512f = 16, kAvx512dq = 17, kAvx512bw = 30, kAvx512vl = 31;
// leaf 7 subleaf 0 ECX
constexpr int kAvx512vbmi = 1, kAvx512vnni = 11;
// leaf 7 subleaf 0 EDX
constexpr int kAmxBf16 = 22, kAvx512fp16 = 23, kAmxTile = 24, kAmxInt8 = 25;
// leaf 7 subleaf 1 EAX
constexpr int kAvxVnni = 4, kAvx512bf16 = 5;
// XCR0 state components the OS enables (SDM vol. 1, 13.1).
constexpr uint64_t kXcr0Ymm = (1u << 1) | (1u << 2);                         // SSE + AVX
constexpr uint64_t kXcr0Zmm = kXcr0Ymm | (1u << 5) | (1u << 6) | (1u << 7);  // + opmask, ZMM
constexpr uint64_t kXcr0Tile = (1u << 17) | (1u << 18);                      // XTILECFG, XTILEDATA
}  // namespace x86

// Linux arch/arm64/include/uapi/asm/hwcap.h
namespace arm {
constexpr int kHwcapAsimd = 1, kHwcapFphp = 9, kHwcapAsimdhp = 10, kHwcapAsimddp = 20,
              kHwcapSve = 22;
constexpr int kHwcap2I8mm = 13;
}  // namespace arm

constexpr CpuFlagName kFlagNames[] = {
    {"SSE3", &CpuFeatures::sse3},
    {"SSSE3", &CpuFeatures::ssse3},
    {"SSE4_1", &CpuFeatures::sse41},
    {"SSE4_2", &CpuFeatures::sse42},
    {"AVX", &CpuFeatures::avx},
    {"AVX2", &CpuFeatures::avx2},
    {"FMA", &CpuFeatures::fma},
    {"F16C", &CpuFeatures::f16c},
    {"BMI2", &CpuFeatures::bmi2},
    {"AVX512F", &CpuFeatures::avx512f},
    {"AVX512DQ", &CpuFeatures::avx512dq},
    {"AVX512BW", &CpuFeatures::avx512bw},
    {"AVX512VL", &CpuFeatures::avx512vl},
    {"AVX512_VBMI", &CpuFeatures::avx512vbmi},
    {"AVX512_VNNI", &CpuFeatures::avx512vnni},
    {"AVX512_BF16", &CpuFeatures::avx512bf16},
    {"AVX512_FP16", &CpuFeatures::avx512fp16},
    {"AVX_VNNI", &CpuFeatures::avx_vnni},
    {"AMX_TILE", &CpuFeatures::amx_tile},
    {"AMX_INT8", &CpuFeatures::amx_int8},
    {"AMX_BF16", &CpuFeatures::amx_bf16},
    {"NEON", &CpuFeatures::neon},
    {"ARM_DOTPROD", &CpuFeatures::arm_dotprod},
    {"ARM_FP16", &CpuFeatures::arm_fp16},
    {"ARM_I8MM", &CpuFeatures::arm_i8mm},
    {"ARM_SVE", &CpuFeatures::arm_sve},
};

#if defined(__x86_64__) || defined(__i386__)
X86CpuidRegs read_x86_cpuid() {
  X86CpuidRegs r;
  unsigned a = 0, b = 0, c = 0, d = 0;
  __cpuid_count(0, 0, a, b, c, d);
  r.max_leaf = a;
  if (r.max_leaf >= 1) {
    __cpuid_count(1, 0, a, b, c, d);
    r.leaf1_ecx = c;
    r.leaf1_edx = d;
  }
  if (r.max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    r.leaf7_max_sub = a;
    r.leaf7_ebx = b;
    r.leaf7_ecx = c;
    r.leaf7_edx = d;
    if (r.leaf7_max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      r.leaf7_1_eax = a;
    }
  }
  // XGETBV faults unless the OS set CR4.OSXSAVE, which CPUID.1:ECX.OSXSAVE mirrors.
  if (bit(r.leaf1_ecx, x86::kOsxsave)) {
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    r.xcr0 = (uint64_t{hi} << 32) | lo;
  }
  return r;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  f = decode_x86_features(read_x86_cpuid());
#elif defined(__aarch64__) && defined(__linux__)
  f = decode_arm_hwcaps(getauxval(AT_HWCAP), getauxval(AT_HWCAP2));
#endif
  return f;
}

}  // namespace

std::span<const CpuFlagName> cpu_flag_names() {
  return kFlagNames;
}

CpuFeatures decode_x86_features(const X86CpuidRegs& r) {
  CpuFeatures f;
  const uint32_t l1c = r.max_leaf >= 1 ? r.leaf1_ecx : 0;
  const bool has7 = r.max_leaf >= 7;
  const uint32_t l7b = has7 ? r.leaf7_ebx : 0;
  const uint32_t l7c = has7 ? r.leaf7_ecx : 0;
  const uint32_t l7d = has7 ? r.leaf7_edx : 0;
  const uint32_t l71a = has7 && r.leaf7_max_sub >= 1 ? r.leaf7_1_eax : 0;

  f.sse3 = bit(l1c, x86::kSse3);
  f.ssse3 = bit(l1c, x86::kSsse3);
  f.sse41 = bit(l1c, x86::kSse41);
  f.sse42 = bit(l1c, x86::kSse42);
  f.bmi2 = bit(l7b, x86::kBmi2);

  // Without OSXSAVE the XCR0 value is meaningless (XGETBV would fault): no YMM/ZMM/tiles.
  const uint64_t xcr0 = bit(l1c, x86::kOsxsave) ? r.xcr0 : 0;
  const bool os_ymm = (xcr0 & x86::kXcr0Ymm) == x86::kXcr0Ymm;
  const bool os_zmm = (xcr0 & x86::kXcr0Zmm) == x86::kXcr0Zmm;
  const bool os_tile = (xcr0 & x86::kXcr0Tile) == x86::kXcr0Tile;

  f.avx = os_ymm && bit(l1c, x86::kAvx);
  f.avx2 = f.avx && bit(l7b, x86::kAvx2);
  f.fma = f.avx && bit(l1c, x86::kFma);
  f.f16c = f.avx && bit(l1c, x86::kF16c);
  f.avx_vnni = f.avx2 && bit(l71a, x86::kAvxVnni);

  f.avx512f = os_zmm && f.avx2 && f.fma && bit(l7b, x86::kAvx512f);
  f.avx512dq = f.avx512f && bit(l7b, x86::kAvx512dq);
  f.avx512bw = f.avx512f && bit(l7b, x86::kAvx512bw);
  f.avx512vl = f.avx512f && bit(l7b, x86::kAvx512vl);
  f.avx512vbmi = f.avx512f && bit(l7c, x86::kAvx512vbmi);
  f.avx512vnni = f.avx512f && bit(l7c, x86::kAvx512vnni);
  f.avx512bf16 = f.avx512f && bit(l71a, x86::kAvx512bf16);
  f.avx512fp16 = f.avx512f && bit(l7d, x86::kAvx512fp16);

  f.amx_tile = os_tile && bit(l7d, x86::kAmxTile);
  f.amx_int8 = f.amx_tile && bit(l7d, x86::kAmxInt8);
  f.amx_bf16 = f.amx_tile && bit(l7d, x86::kAmxBf16);
  return f;
}

CpuFeatures decode_arm_hwcaps(uint64_t hwcap, uint64_t hwcap2) {
  CpuFeatures f;
  f.neon = bit(hwcap, arm::kHwcapAsimd);
  f.arm_dotprod = f.neon && bit(hwcap, arm::kHwcapAsimddp);
  f.arm_fp16 = f.neon && bit(hwcap, arm::kHwcapFphp) && bit(hwcap, arm::kHwcapAsimdhp);
  f.arm_i8mm = f.neon && bit(hwcap2, arm::kHwcap2I8mm);
  f.arm_sve = bit(hwcap, arm::kHwcapSve);
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string to_string(const CpuFeatures& f) {
  std::string out;
  for (const CpuFlagName& flag : kFlagNames) {
    if (!(f.*flag.member)) continue;
    if (!out.empty()) out += ' ';
    out += flag.name;
  }
  return out;
}

int num_logical_cores() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

int num_available_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  return num_logical_cores();
}

namespace {

// Contents of a small sysfs file without its trailing newline, or "" when unreadable.
std::string read_small_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return {};
  char buf[256];
  const size_t num_read = std::fread(buf, 1, sizeof(buf) - 1, file);
  std::fclose(file);
  std::string s(buf, num_read);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

int num_physical_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return num_available_cores();
  // Each physical core is identified by the list of its SMT siblings ("0,64" or "0-1").
  std::set<std::string> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::string siblings = read_small_file(dir + "core_cpus_list");
    if (siblings.empty()) siblings = read_small_file(dir + "thread_siblings_list");
    if (siblings.empty()) return num_available_cores();
    cores.insert(siblings);
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
#endif
  return num_available_cores();
}

}  // namespace kiln::util
