#include "kiln/backend/rendezvous.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

namespace kiln::backend {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'R', 'D', 'V', '1'};
constexpr uint32_t kMaxBlob = 1u << 20;

// A socket closed with the object.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Waits until fd is readable (or writable); false at the deadline.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

Status write_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return err("timed out sending");
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return err("send failed: {}", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

Status read_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return err("timed out receiving");
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return err("the peer closed the connection");
    if (r < 0) return err("receive failed: {}", std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return {};
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

Expected<uint32_t> read_u32(int fd, Clock::time_point deadline) {
  unsigned char b[4];
  KILN_TRY_STATUS(read_all(fd, b, 4, deadline));
  return static_cast<uint32_t>(b[0] | b[1] << 8 | b[2] << 16 | static_cast<uint32_t>(b[3]) << 24);
}

Expected<std::string> read_blob(int fd, Clock::time_point deadline) {
  KILN_TRY(const uint32_t n, read_u32(fd, deadline));
  if (n > kMaxBlob) return err("a blob of {} bytes (at most {})", n, kMaxBlob);
  std::string s(n, '\0');
  KILN_TRY_STATUS(read_all(fd, s.data(), n, deadline));
  return s;
}

Expected<addrinfo*> resolve(const RendezvousOptions& o, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(o.master_port);
  if (const int rc = ::getaddrinfo(o.master_addr.c_str(), port.c_str(), &hints, &res); rc != 0)
    return err("rendezvous: cannot resolve {}: {}", o.master_addr, ::gai_strerror(rc));
  return res;
}

// Node 0: listens, takes the other nodes' blobs, answers each with all of them.
Expected<std::vector<std::string>> serve(const RendezvousOptions& o, const std::string& blob,
                                         const std::function<void(int)>& on_listening,
                                         Clock::time_point deadline) {
  KILN_TRY(addrinfo * res, resolve(o, true));
  Fd listener;
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && listener.fd < 0; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (s.fd < 0) continue;
    const int one = 1;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.fd, 64) != 0) {
      why = std::strerror(errno);
      continue;
    }
    listener = std::move(s);
  }
  ::freeaddrinfo(res);
  if (listener.fd < 0)
    return err("rendezvous: node 0 cannot listen on {}:{}: {}", o.master_addr, o.master_port, why);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (on_listening) on_listening(port);

  std::vector<std::string> blobs(static_cast<size_t>(o.nnodes));
  std::vector<Fd> peers(static_cast<size_t>(o.nnodes));
  blobs[0] = blob;
  int joined = 1;
  auto refuse = [&](int fd, const std::string& msg) {
    std::string out(kMagic, sizeof(kMagic));
    out.push_back(1);
    put_u32(out, static_cast<uint32_t>(msg.size()));
    out += msg;
    (void)write_all(fd, out.data(), out.size(), deadline);
  };
  while (joined < o.nnodes) {
    if (!wait_fd(listener.fd, POLLIN, deadline))
      return err("rendezvous: timed out with {} of {} nodes joined at {}:{}", joined, o.nnodes,
                 o.master_addr, port);
    Fd c(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (c.fd < 0) continue;
    char magic[sizeof(kMagic)];
    if (!read_all(c.fd, magic, sizeof(magic), deadline).ok() ||
        std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
      continue;  // not a kiln node: not counted
    auto nnodes = read_u32(c.fd, deadline);
    auto rank = read_u32(c.fd, deadline);
    auto theirs =
        nnodes.ok() && rank.ok() ? read_blob(c.fd, deadline) : Expected<std::string>(err("header"));
    if (!theirs.ok()) continue;
    if (*nnodes != static_cast<uint32_t>(o.nnodes)) {
      refuse(c.fd, fmt::format("--nnodes {} differs from node 0's {}", *nnodes, o.nnodes));
      continue;
    }
    if (*rank == 0 || *rank >= static_cast<uint32_t>(o.nnodes) || peers[*rank].fd >= 0) {
      refuse(c.fd,
             fmt::format("--node-rank {} is out of 1..{} or already joined", *rank, o.nnodes - 1));
      continue;
    }
    blobs[*rank] = std::move(*theirs);
    peers[*rank] = std::move(c);
    ++joined;
  }
  std::string out(kMagic, sizeof(kMagic));
  out.push_back(0);
  for (const std::string& b : blobs) {
    put_u32(out, static_cast<uint32_t>(b.size()));
    out += b;
  }
  for (int r = 1; r < o.nnodes; ++r) {
    const Status st = write_all(peers[static_cast<size_t>(r)].fd, out.data(), out.size(), deadline);
    if (!st.ok()) return err("rendezvous: node {}: {}", r, st.error().message);
  }
  return blobs;
}

// Node r > 0: connects to node 0 (again until the deadline: it may start later), sends its
// blob, reads every node's.
Expected<std::vector<std::string>> join(const RendezvousOptions& o, const std::string& blob,
                                        Clock::time_point deadline) {
  std::string hello(kMagic, sizeof(kMagic));
  put_u32(hello, static_cast<uint32_t>(o.nnodes));
  put_u32(hello, static_cast<uint32_t>(o.node_rank));
  put_u32(hello, static_cast<uint32_t>(blob.size()));
  hello += blob;
  std::string why = "no answer";
  while (Clock::now() < deadline) {
    KILN_TRY(addrinfo * res, resolve(o, false));
    Fd c;
    for (addrinfo* a = res; a != nullptr && c.fd < 0; a = a->ai_next) {
      Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (s.fd >= 0 && ::connect(s.fd, a->ai_addr, a->ai_addrlen) == 0)
        c = std::move(s);
      else
        why = std::strerror(errno);
    }
    ::freeaddrinfo(res);
    if (c.fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    KILN_TRY_STATUS(write_all(c.fd, hello.data(), hello.size(), deadline));
    char magic[sizeof(kMagic)];
    char status = 0;
    KILN_TRY_STATUS(read_all(c.fd, magic, sizeof(magic), deadline));
    if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
      return err("rendezvous: {}:{} is not a kiln node 0", o.master_addr, o.master_port);
    KILN_TRY_STATUS(read_all(c.fd, &status, 1, deadline));
    if (status != 0) {
      KILN_TRY(const std::string msg, read_blob(c.fd, deadline));
      return err("rendezvous: node 0 refused node {}: {}", o.node_rank, msg);
    }
    std::vector<std::string> blobs;
    for (int r = 0; r < o.nnodes; ++r) {
      KILN_TRY(std::string b, read_blob(c.fd, deadline));
      blobs.push_back(std::move(b));
    }
    return blobs;
  }
  return err("rendezvous: node {} timed out reaching node 0 at {}:{} ({})", o.node_rank,
             o.master_addr, o.master_port, why);
}

}  // namespace

Status parse_master_addr(const std::string& s, RendezvousOptions* o) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    return err("--master-addr '{}': expected HOST:PORT", s);
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = 0;
  const char* first = s.data() + colon + 1;
  const char* last = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(first, last, port);
  if (ec != std::errc() || ptr != last || port < 0 || port > 65535)
    return err("--master-addr '{}': the port must be in 0..65535", s);
  o->master_addr = host;
  o->master_port = port;
  return {};
}

Expected<std::vector<std::string>> rendezvous(const RendezvousOptions& o, const std::string& blob,
                                              const std::function<void(int)>& on_listening) {
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    return err("rendezvous: --node-rank {} is outside 0..{} (--nnodes {})", o.node_rank,
               o.nnodes - 1, o.nnodes);
  if (blob.size() > kMaxBlob) return err("rendezvous: a blob of {} bytes", blob.size());
  const Clock::time_point deadline = Clock::now() + o.timeout;
  if (o.node_rank == 0) return serve(o, blob, on_listening, deadline);
  return join(o, blob, deadline);
}

}  // namespace kiln::backend
