// delay_line: a WAN link's latency, jitter and loss for the packets of one NFQUEUE queue, as real
// packet delay that the kernel's TCP sees, on kernels without sch_netem. tools/wan_link.py starts
// one per emulated host, inside its network namespace, for the packets arriving on its NIC (and
// says why there).
//
// Guarantees (see --help for the arguments):
// - Every packet the queue hands over gets one verdict: dropped at arrival with probability
//   --loss, else accepted no earlier than arrival + delay + its jitter sample.
// - Packets are accepted in arrival order: with jitter, a packet whose sample would release it
//   before the packet ahead of it waits for that packet (no reordering).
// - With loss or jitter, the packets it holds are wire-sized: it does not ask for
//   NFQA_CFG_F_GSO, so the kernel segments a GSO packet (veth passes TCP's 64 KB segments on
//   whole) before queueing it, and each frame is dropped or jittered on its own. With a delay
//   alone it asks for NFQA_CFG_F_GSO: the frames of one GSO packet arrive together and would be
//   released together, so holding the packet whole gives the same timing for a fraction of
//   the work (the receiving TCP then gets them whole, as from a NIC with GRO).
// - On SIGTERM or SIGINT, or when the process that started it exits, it accepts every packet
//   still held, prints its counters on stdout and exits with status 0.
// - It prints one "ready" line on stdout once the queue is bound; errors before that go to
//   stderr, naming what failed, with exit status 2.
//
// One thread: the netlink socket and the release time of the oldest held packet are waited on
// with ppoll; accepts go out as NFQNL_MSG_VERDICT_BATCH (every held packet up to an id), which
// the in-order release makes exact.
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libmnl/libmnl.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kExitSetupFailed = 2;
constexpr int kBatch = 64;            // netlink messages read per recvmmsg
constexpr int kMessageBytes = 4096;   // one packet message (metadata only) fits
constexpr int64_t kParentCheckNs = 100'000'000;

struct Options {
  uint16_t queue = 0;
  int64_t delay_ns = 0;
  int64_t jitter_ns = 0;
  double loss = 0;
  uint64_t seed = 1;
  uint32_t max_held = 16384;
  std::string label = "delay_line";
};

volatile sig_atomic_t g_stop_signal = 0;

void OnSignal(int sig) { g_stop_signal = sig; }

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

[[noreturn]] void Fail(const Options& o, const std::string& what) {
  fprintf(stderr, "%s: %s\n", o.label.c_str(), what.c_str());
  exit(kExitSetupFailed);
}

void Usage(FILE* out) {
  fprintf(out,
      "usage: delay_line --queue N --delay TIME [--jitter TIME] [--loss P] [--seed S]\n"
      "                  [--max-held N] [--label NAME]\n"
      "Holds each packet of NFQUEUE queue N (this network namespace) and accepts it at its\n"
      "arrival + delay (+ a jitter sample); drops a fraction P of the packets at arrival.\n"
      "  --queue N      NFQUEUE queue number (iptables ... -j NFQUEUE --queue-num N)\n"
      "  --delay TIME   one-way delay added to every packet: 25ms, 500us, 0.1s, 0\n"
      "  --jitter TIME  each packet's delay is delay + a uniform sample in [-TIME, +TIME]\n"
      "                 (never below 0). Packets never overtake each other: one whose sample\n"
      "                 would release it before the packet ahead waits for that packet, so at\n"
      "                 high packet rates the delay tends to delay + TIME.\n"
      "  --loss P       probability in [0, 1) that a packet is dropped (independently)\n"
      "  --seed S       seed of the jitter and loss samples (default 1)\n"
      "  With a delay alone GSO packets are held whole, else the kernel splits them into frames.\n"
      "  --max-held N   the most packets held at once: the kernel queue's maxlen; beyond it\n"
      "                 the kernel drops packets (counted as kernel_queue_full). Default 16384,\n"
      "                 4 x the MTU-sized packets in flight at 1 Gbit/s with 50 ms delay.\n"
      "  --label NAME   prefix of its messages (default delay_line)\n"
      "Needs root (CAP_NET_ADMIN). Exits on SIGTERM/SIGINT or when its parent exits, accepting\n"
      "the packets it still holds, and prints: packets, accepted, dropped, max_held,\n"
      "kernel_queue_full, kernel_user_dropped (messages the kernel could not deliver to it),\n"
      "netlink_overruns, verdict_errors, late_mean_us and late_max_us (how long after its time\n"
      "a packet was accepted). It runs as SCHED_FIFO (lowest real-time priority) where allowed.\n");
}

// "25ms", "500us", "0.1s", "0" -> nanoseconds; -1 when malformed.
int64_t ParseTime(const char* text) {
  char* end = nullptr;
  errno = 0;
  double value = strtod(text, &end);
  if (errno != 0 || end == text || !(value >= 0) || !std::isfinite(value)) return -1;
  std::string unit(end);
  double scale;
  if (unit == "s") scale = 1e9;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "us") scale = 1e3;
  else if (unit.empty() && value == 0) scale = 0;
  else return -1;
  double ns = value * scale;
  if (ns > 3600e9) return -1;
  return static_cast<int64_t>(std::llround(ns));
}

bool ParseUnsigned(const char* text, uint64_t max, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v > max) return false;
  *out = v;
  return true;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  static const option kLong[] = {
      {"queue", required_argument, nullptr, 'q'},  {"delay", required_argument, nullptr, 'd'},
      {"jitter", required_argument, nullptr, 'j'}, {"loss", required_argument, nullptr, 'l'},
      {"seed", required_argument, nullptr, 's'},   {"max-held", required_argument, nullptr, 'm'},
      {"label", required_argument, nullptr, 'n'},  {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  bool have_queue = false, have_delay = false;
  int c;
  while ((c = getopt_long(argc, argv, "", kLong, nullptr)) != -1) {
    uint64_t v = 0;
    switch (c) {
      case 'q':
        if (!ParseUnsigned(optarg, 65535, &v)) Fail(o, std::string("--queue must be 0..65535, got ") + optarg);
        o.queue = static_cast<uint16_t>(v);
        have_queue = true;
        break;
      case 'd':
        if ((o.delay_ns = ParseTime(optarg)) < 0) Fail(o, std::string("bad --delay ") + optarg + " (e.g. 25ms, 500us, 0)");
        have_delay = true;
        break;
      case 'j':
        if ((o.jitter_ns = ParseTime(optarg)) < 0) Fail(o, std::string("bad --jitter ") + optarg + " (e.g. 2ms, 0)");
        break;
      case 'l': {
        char* end = nullptr;
        o.loss = strtod(optarg, &end);
        if (end == optarg || *end != '\0' || !(o.loss >= 0 && o.loss < 1))
          Fail(o, std::string("--loss must be a probability in [0, 1), got ") + optarg);
        break;
      }
      case 's':
        if (!ParseUnsigned(optarg, UINT64_MAX, &v)) Fail(o, std::string("bad --seed ") + optarg);
        o.seed = v;
        break;
      case 'm':
        if (!ParseUnsigned(optarg, 1u << 24, &v) || v == 0) Fail(o, std::string("--max-held must be 1..16777216, got ") + optarg);
        o.max_held = static_cast<uint32_t>(v);
        break;
      case 'n':
        o.label = optarg;
        break;
      case 'h':
        Usage(stdout);
        exit(0);
      default:
        Usage(stderr);
        exit(kExitSetupFailed);
    }
  }
  if (optind != argc) Fail(o, std::string("unexpected argument ") + argv[optind]);
  if (!have_queue || !have_delay) {
    Usage(stderr);
    Fail(o, "--queue and --delay are required");
  }
  return o;
}

// Held packets in arrival order: a ring of (packet id, release time), capacity max_held (the
// kernel never hands over more than its queue's maxlen without a verdict).
class HeldRing {
 public:
  explicit HeldRing(size_t capacity) : slots_(capacity) {}
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  bool full() const { return size_ == slots_.size(); }
  void push(uint32_t id, int64_t release_ns) {
    slots_[(head_ + size_) % slots_.size()] = {id, release_ns};
    ++size_;
  }
  uint32_t front_id() const { return slots_[head_].id; }
  int64_t front_release() const { return slots_[head_].release_ns; }
  void pop() {
    head_ = (head_ + 1) % slots_.size();
    --size_;
  }

 private:
  struct Slot {
    uint32_t id;
    int64_t release_ns;
  };
  std::vector<Slot> slots_;
  size_t head_ = 0, size_ = 0;
};

struct Counters {
  uint64_t packets = 0, accepted = 0, dropped = 0, overruns = 0, verdict_errors = 0;
  size_t max_held = 0;
  // How late packets were accepted after their release time (the process's wake-up latency).
  int64_t late_max_ns = 0, late_sum_ns = 0;
};

// Whether this process has CAP_NET_ADMIN (bit 12 of CapEff in /proc/self/status).
bool HasNetAdmin() {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return geteuid() == 0;
  char line[256];
  unsigned long long caps = 0;
  bool found = false;
  while (fgets(line, sizeof line, f) != nullptr) {
    if (sscanf(line, "CapEff: %llx", &caps) == 1) {
      found = true;
      break;
    }
  }
  fclose(f);
  return found ? (caps >> 12 & 1) != 0 : geteuid() == 0;
}

class DelayLine {
 public:
  explicit DelayLine(const Options& o)
      : o_(o), held_(o.max_held), rng_(o.seed), send_buf_(MNL_SOCKET_BUFFER_SIZE) {}

  void Open() {
    if (!HasNetAdmin())
      Fail(o_, "not root (euid " + std::to_string(geteuid()) + ", no CAP_NET_ADMIN): binding an NFQUEUE queue needs CAP_NET_ADMIN");
    nl_ = mnl_socket_open(NETLINK_NETFILTER);
    if (nl_ == nullptr)
      Fail(o_, std::string("cannot open a netfilter netlink socket (") + strerror(errno) + "): the kernel has no nfnetlink (CONFIG_NETFILTER_NETLINK)");
    if (mnl_socket_bind(nl_, 0, MNL_SOCKET_AUTOPID) < 0) Fail(o_, std::string("netlink bind: ") + strerror(errno));
    portid_ = mnl_socket_get_portid(nl_);
    // Room for every held packet's message should this process be descheduled while the kernel
    // queues them (SO_RCVBUFFORCE: above rmem_max, root only).
    int rcvbuf = static_cast<int>(std::min<uint64_t>(uint64_t{o_.max_held} * 2048, 1u << 30));
    int fd = mnl_socket_get_fd(nl_);
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) < 0)
      Fail(o_, std::string("SO_RCVBUFFORCE on the netlink socket: ") + strerror(errno));
    socklen_t len = sizeof rcvbuf_;
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf_, &len);

    Config([&](nlmsghdr* nlh) { nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_BIND); }, "bind");
    bound_ = true;
    const uint32_t gso = o_.loss == 0 && o_.jitter_ns == 0 ? NFQA_CFG_F_GSO : 0;
    Config([&](nlmsghdr* nlh) {
      nfq_nlmsg_cfg_put_params(nlh, NFQNL_COPY_META, 0);
      nfq_nlmsg_cfg_put_qmaxlen(nlh, o_.max_held);
      mnl_attr_put_u32(nlh, NFQA_CFG_FLAGS, htonl(gso));
      mnl_attr_put_u32(nlh, NFQA_CFG_MASK, htonl(NFQA_CFG_F_GSO));
    }, "set copy mode, queue length and GSO flag");
    whole_gso_ = gso != 0;
  }

  // Runs until a signal or the parent's exit; then accepts what is held.
  void Run() {
    sigset_t blocked, during_wait;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigprocmask(SIG_BLOCK, &blocked, &during_wait);
    sigdelset(&during_wait, SIGTERM);
    sigdelset(&during_wait, SIGINT);
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);

    // A link's delay does not depend on how busy the host's CPUs are: the line runs ahead of
    // ordinary processes (SCHED_FIFO, the lowest real-time priority) where it may.
    sched_param sp = {};
    sp.sched_priority = 1;
    const char* sched = sched_setscheduler(0, SCHED_FIFO, &sp) == 0 ? "fifo" : "other";

    const pid_t parent = getppid();
    printf("%s: ready queue=%u delay_ns=%lld jitter_ns=%lld loss=%g max_held=%u rcvbuf=%d sched=%s gso=%s\n",
           o_.label.c_str(), o_.queue, static_cast<long long>(o_.delay_ns), static_cast<long long>(o_.jitter_ns),
           o_.loss, o_.max_held, rcvbuf_, sched, whole_gso_ ? "whole" : "segmented");
    fflush(stdout);

    std::vector<char> bufs(size_t{kBatch} * kMessageBytes);
    std::vector<iovec> iov(kBatch);
    std::vector<mmsghdr> msgs(kBatch);
    pollfd pfd = {mnl_socket_get_fd(nl_), POLLIN, 0};
    int64_t next_parent_check = NowNs() + kParentCheckNs;
    while (g_stop_signal == 0) {
      int64_t now = NowNs();
      ReleaseDue(now);
      if (now >= next_parent_check) {
        if (getppid() != parent) break;
        next_parent_check = now + kParentCheckNs;
      }
      int64_t wait_ns = next_parent_check - now;
      if (!held_.empty()) wait_ns = std::min(wait_ns, std::max<int64_t>(0, held_.front_release() - now));
      timespec ts = {static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
      int ready = ppoll(&pfd, 1, &ts, &during_wait);
      if (ready < 0) {
        if (errno == EINTR) continue;
        Fail(o_, std::string("ppoll: ") + strerror(errno));
      }
      if (ready > 0) ReadAll(bufs, iov, msgs);
    }
    // Stopping: whatever is held goes out now rather than being dropped with the queue.
    if (!held_.empty()) {
      uint32_t last = 0;
      while (!held_.empty()) {
        last = held_.front_id();
        held_.pop();
        ++counters_.accepted;
      }
      SendVerdict(NFQNL_MSG_VERDICT_BATCH, last, NF_ACCEPT);
    }
  }

  void PrintCounters() {
    unsigned kernel_full = 0, kernel_user_dropped = 0;
    KernelQueueDrops(&kernel_full, &kernel_user_dropped);
    uint64_t released = counters_.accepted > 0 ? counters_.accepted : 1;
    printf("%s: packets=%llu accepted=%llu dropped=%llu max_held=%zu kernel_queue_full=%u "
           "kernel_user_dropped=%u netlink_overruns=%llu verdict_errors=%llu late_mean_us=%lld late_max_us=%lld\n",
           o_.label.c_str(), static_cast<unsigned long long>(counters_.packets),
           static_cast<unsigned long long>(counters_.accepted), static_cast<unsigned long long>(counters_.dropped),
           counters_.max_held, kernel_full, kernel_user_dropped, static_cast<unsigned long long>(counters_.overruns),
           static_cast<unsigned long long>(counters_.verdict_errors),
           static_cast<long long>(counters_.late_sum_ns / static_cast<int64_t>(released) / 1000),
           static_cast<long long>(counters_.late_max_ns / 1000));
    fflush(stdout);
  }

  void Close() {
    if (bound_) {
      // Errors ignored: the process exits next, which unbinds the queue anyway.
      nlmsghdr* nlh = nfq_nlmsg_put(send_buf_.data(), NFQNL_MSG_CONFIG, o_.queue);
      nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_UNBIND);
      mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len);
    }
    if (nl_ != nullptr) mnl_socket_close(nl_);
  }

 private:
  // Sends one NFQNL_MSG_CONFIG built by `fill`, waits for its acknowledgement; a refusal ends
  // the process with what failed.
  template <typename Fill>
  void Config(Fill fill, const char* what) {
    nlmsghdr* nlh = nfq_nlmsg_put(send_buf_.data(), NFQNL_MSG_CONFIG, o_.queue);
    nlh->nlmsg_flags |= NLM_F_ACK;
    nlh->nlmsg_seq = ++seq_;
    fill(nlh);
    if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) Fail(o_, std::string(what) + ": send: " + strerror(errno));
    std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
    for (;;) {
      ssize_t n = mnl_socket_recvfrom(nl_, buf.data(), buf.size());
      if (n < 0) Fail(o_, std::string(what) + ": receive: " + strerror(errno));
      int r = mnl_cb_run(buf.data(), n, seq_, portid_, nullptr, nullptr);
      if (r == MNL_CB_ERROR) {
        int err = errno;
        std::string why = std::string(what) + " of queue " + std::to_string(o_.queue) + " refused: " + strerror(err);
        if (err == EPERM)  // with CAP_NET_ADMIN (checked in Open), the kernel's answer to a queue bound by another socket
          why += " (queue busy: it is bound by another process in this network namespace, another delay line or NFQUEUE listener)";
        else if (err == ENOENT || err == EOPNOTSUPP || err == EPROTONOSUPPORT || err == EINVAL)
          why += " (the kernel has no NFQUEUE support: CONFIG_NETFILTER_NETLINK_QUEUE)";
        Fail(o_, why);
      }
      if (r == MNL_CB_STOP) return;  // the ACK (an NLMSG_ERROR with error 0)
    }
  }

  void SendVerdict(int type, uint32_t id, int verdict) {
    nlmsghdr* nlh = nfq_nlmsg_put(send_buf_.data(), type, o_.queue);
    nfq_nlmsg_verdict_put(nlh, static_cast<int>(id), verdict);
    if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) {
      if (counters_.verdict_errors++ == 0) fprintf(stderr, "%s: sending a verdict: %s\n", o_.label.c_str(), strerror(errno));
    }
  }

  void ReleaseDue(int64_t now) {
    if (held_.empty() || held_.front_release() > now) return;
    uint32_t last = 0;
    while (!held_.empty() && held_.front_release() <= now) {
      int64_t late = now - held_.front_release();
      counters_.late_sum_ns += late;
      if (late > counters_.late_max_ns) counters_.late_max_ns = late;
      last = held_.front_id();
      held_.pop();
      ++counters_.accepted;
    }
    SendVerdict(NFQNL_MSG_VERDICT_BATCH, last, NF_ACCEPT);
  }

  void ReadAll(std::vector<char>& bufs, std::vector<iovec>& iov, std::vector<mmsghdr>& msgs) {
    for (;;) {
      for (int i = 0; i < kBatch; ++i) {
        iov[i] = {bufs.data() + static_cast<size_t>(i) * kMessageBytes, kMessageBytes};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      int n = recvmmsg(mnl_socket_get_fd(nl_), msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) return;
        if (errno == ENOBUFS) {  // messages lost: their packets go out with the next batch accept
          ++counters_.overruns;
          continue;
        }
        Fail(o_, std::string("recvmmsg: ") + strerror(errno));
      }
      int64_t now = NowNs();
      for (int i = 0; i < n; ++i) {
        const nlmsghdr* nlh = reinterpret_cast<const nlmsghdr*>(iov[i].iov_base);
        int len = static_cast<int>(msgs[i].msg_len);
        for (; mnl_nlmsg_ok(nlh, len); nlh = mnl_nlmsg_next(nlh, &len)) {
          if (nlh->nlmsg_type == NLMSG_ERROR) {
            const nlmsgerr* err = static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(nlh));
            if (err->error != 0 && counters_.verdict_errors++ == 0)
              fprintf(stderr, "%s: a verdict was refused: %s\n", o_.label.c_str(), strerror(-err->error));
            continue;
          }
          OnPacket(nlh, now);
        }
      }
      if (n < kBatch) return;
    }
  }

  void OnPacket(const nlmsghdr* nlh, int64_t now) {
    nlattr* attr[NFQA_MAX + 1] = {};
    if (nfq_nlmsg_parse(nlh, attr) < 0 || attr[NFQA_PACKET_HDR] == nullptr) return;
    auto* hdr = static_cast<nfqnl_msg_packet_hdr*>(mnl_attr_get_payload(attr[NFQA_PACKET_HDR]));
    uint32_t id = ntohl(hdr->packet_id);
    ++counters_.packets;
    if (o_.loss > 0 && uniform_(rng_) < o_.loss) {
      ++counters_.dropped;
      SendVerdict(NFQNL_MSG_VERDICT, id, NF_DROP);
      return;
    }
    int64_t delay = o_.delay_ns;
    if (o_.jitter_ns > 0) {
      delay += static_cast<int64_t>(std::llround((2 * uniform_(rng_) - 1) * static_cast<double>(o_.jitter_ns)));
      if (delay < 0) delay = 0;
    }
    int64_t release = now + delay;
    if (release < last_release_) release = last_release_;  // never overtake the packet ahead
    last_release_ = release;
    if (held_.full()) {
      // Cannot happen while the kernel queue's maxlen is max_held; accept rather than lose it.
      SendVerdict(NFQNL_MSG_VERDICT, id, NF_ACCEPT);
      ++counters_.accepted;
      return;
    }
    held_.push(id, release);
    if (held_.size() > counters_.max_held) counters_.max_held = held_.size();
  }

  // The kernel's own drop counters of this queue (/proc/net/netfilter/nfnetlink_queue:
  // queue_dropped = queue full, user_dropped = messages it could not deliver to the socket).
  void KernelQueueDrops(unsigned* full, unsigned* user_dropped) {
    FILE* f = fopen("/proc/net/netfilter/nfnetlink_queue", "r");
    if (f == nullptr) return;
    unsigned num, portid, total, mode, range, dropped, udropped, seq, one;
    while (fscanf(f, "%u %u %u %u %u %u %u %u %u", &num, &portid, &total, &mode, &range, &dropped, &udropped, &seq,
                  &one) == 9) {
      if (num == o_.queue && portid == portid_) {
        *full = dropped;
        *user_dropped = udropped;
      }
    }
    fclose(f);
  }

  const Options o_;
  HeldRing held_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  std::vector<char> send_buf_;
  mnl_socket* nl_ = nullptr;
  unsigned portid_ = 0;
  unsigned seq_ = 0;
  int rcvbuf_ = 0;
  bool bound_ = false;
  bool whole_gso_ = false;
  int64_t last_release_ = 0;
  Counters counters_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseArgs(argc, argv);
  DelayLine line(o);
  line.Open();
  line.Run();
  line.PrintCounters();
  line.Close();
  return 0;
}
