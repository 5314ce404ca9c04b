#include "dist/rendezvous/world_join.h"

#include <unistd.h>

#include <set>
#include <sstream>

#include <thread>

#include "dist/rendezvous/job_store.h"
#include "dist/rendezvous/secret_file.h"
#include "dist/rendezvous/store_server.h"
#include "dist/transport/handshake.h"

namespace push::dist::detail {
namespace {

using push::detail::Clock;
using Steady = std::chrono::steady_clock;
constexpr const char* kOrigin = "push::dist::World";

struct Record {
  std::string job_id;
  int world_size = 0;
  std::string process;  // host:pid
  // Of the job secret given to this rank; "~" and the fingerprint when rank 0 drew it (no
  // secret given); "-" for other ranks given none.
  std::string fingerprint;
  std::string name;
};

std::string encode(const Record& r) {
  return c10::str("push-rank-v1\n", r.job_id, "\n", r.world_size, "\n", r.process, "\n", r.fingerprint, "\n", r.name);
}

/// The record rank `rank` published; throws when it is not push's (another program's keys).
Record decode(const std::string& text, int rank) {
  std::istringstream in(text);
  std::string magic, size;
  Record r;
  const bool ok = std::getline(in, magic) && magic == "push-rank-v1" && std::getline(in, r.job_id) &&
                  std::getline(in, size) && std::getline(in, r.process) && std::getline(in, r.fingerprint);
  PUSH_CHECK(ok, kOrigin, "the store holds a record for rank ", rank,
             " that push did not write: another program uses this MASTER_PORT");
  r.world_size = std::atoi(size.c_str());
  std::getline(in, r.name, '\0');
  return r;
}

/// Whether the record's rank was given PUSH_JOB_SECRET.
bool given(const std::string& fingerprint) { return fingerprint != "-" && fingerprint.rfind('~', 0) != 0; }

std::string job_text(const std::string& id) { return id.empty() ? std::string("no job id") : "job '" + id + "'"; }

std::string key(const WorldOptions& o, const std::string& what) {
  return c10::str("push/world/", o.job_id(), "/", what);
}

/// Waits until `k` is in the store or `deadline`; false at the deadline.
bool arrives(c10d::Store& store, const std::string& k, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return store.check({k});
  try {
    store.wait({k}, std::max(left, std::chrono::milliseconds(1)));
    return true;
  } catch (const JobStore::Timeout&) {
    // push's store ended the wait at its timeout, which its own clock may reach a little
    // before this one reaches `deadline`: the key did not come, not a failure of the store.
    return store.check({k});
  } catch (const std::exception&) {
    if (store.check({k})) return true;
    if (Clock::now() < deadline) throw;  // not a timeout: the store failed
    return false;
  }
}

}  // namespace

std::string this_process() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return c10::str(host, ":", ::getpid());
}

int store_listen_fd(const std::string& host, int port) {
  constexpr const char* origin = "push::dist::World";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  PUSH_CHECK(::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list) == 0, origin,
             "cannot resolve MASTER_ADDR '", host, "'");
  std::string why = "no address";
  int fd = -1;
  for (auto* a = list; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(list);
  PUSH_CHECK(fd >= 0, origin, "rank 0 cannot host the store at ", host, ":", port, ": ", why,
             " (is MASTER_ADDR an address of this host, and MASTER_PORT free?)");
  return fd;
}

namespace {

/// Rank 0's drawn secret, for the others (secret_file.h); nothing when it was given or alone.
void write_secret_file(WorldState& s) {
  const WorldOptions& o = s.options;
  if (o.world_size() == 1 || !o.job_secret().empty()) return;
  s.secret_file = secret_file::path_for(o.master_addr(), o.master_port(), o.job_id());
  secret_file::write(s.secret_file, s.secret);
}

}  // namespace

void take_secret(WorldState& s) {
  const WorldOptions& o = s.options;
  if (!o.job_secret().empty()) {
    s.secret = handshake::from_hex(o.job_secret(), "PUSH_JOB_SECRET");
  } else if (o.rank() == 0) {
    // Drawn here and handed to the others through a file only this user can read, never
    // through the store: under push's own store, once rank 0 holds MASTER_PORT and before
    // it listens (open_own_store), so that a second rank 0 started on a port already taken
    // does not overwrite the running job's file; under a launcher's store, here.
    s.secret = handshake::random_bytes();
    if (o.launcher_hosts_store()) write_secret_file(s);
  }
}

c10::intrusive_ptr<c10d::Store> open_own_store(WorldState& s, Steady::time_point deadline) {
  const WorldOptions& o = s.options;
  const JobStore::Options jo = s.store_client();
  if (o.rank() == 0) {
    StoreServer::Options so;
    so.listen_fd = store_listen_fd(o.master_addr(), o.master_port());
    try {
      write_secret_file(s);
    } catch (...) {
      ::close(so.listen_fd);
      throw;
    }
    so.key = JobStore::key_for(s.secret, o.job_id());
    so.job_id = o.job_id();
    so.address = c10::str(o.master_addr(), ":", o.master_port());
    so.world_size = o.world_size();
    so.handshake_timeout = std::min(o.init_timeout(), Milliseconds(5000));
    s.server = std::make_unique<StoreServer>(std::move(so));
  }
  if (o.rank() == 0 || !o.job_secret().empty()) return c10::make_intrusive<JobStore>(jo, s.store_key(), deadline);
  // No secret given: rank 0 drew one into a private file (take_secret) before its store
  // listened. So once this job's store answers, the file is there on rank 0's host: missing
  // here, this rank is on another host (or another private folder); holding a secret the
  // store cannot prove, it is an earlier job's.
  JobStore::expect_this_job(jo, deadline);
  const std::string path = secret_file::path_for(o.master_addr(), o.master_port(), o.job_id());
  const auto secret = secret_file::try_read(path);
  const std::string cannot = c10::str("rank 0 drew the job's secret into ", path, ", which this rank cannot use: ");
  constexpr const char* how =
      "; give every rank the same PUSH_JOB_SECRET (export PUSH_JOB_SECRET=$(openssl rand -hex 32)) or start the job "
      "with push launch";
  PUSH_CHECK(secret.has_value(), kOrigin, cannot,
             "there is no such file (is this rank on another host than rank 0, or was rank 0 alone given "
             "PUSH_JOB_SECRET?)",
             how);
  s.secret = *secret;
  try {
    return c10::make_intrusive<JobStore>(jo, s.store_key(), deadline);
  } catch (const JobStore::WrongKey&) {
    throw Error(c10::str("[", kOrigin, "] ", cannot,
                         "it holds another secret than rank 0's store proves (a file of an earlier job?)", how));
  }
}

void join_job(WorldState& s, Clock::time_point deadline) {
  const WorldOptions& o = s.options;
  c10d::Store& store = *s.store;
  const int me = o.rank(), n = o.world_size();
  const std::string where = c10::str(o.master_addr(), ":", o.master_port());
  Record mine{o.job_id(), n, this_process(), "-", o.name()};
  if (!o.job_secret().empty()) {
    mine.fingerprint = handshake::fingerprint(s.secret);
  } else if (me == 0) {
    mine.fingerprint = "~" + handshake::fingerprint(s.secret);
  }
  // Every other rank's record must agree with this one's.
  auto check = [&](const Record& theirs, int r) {
    const std::string them = c10::str("rank ", r, " (", theirs.process, ")");
    PUSH_CHECK(theirs.job_id == o.job_id(), kOrigin, them, " belongs to ", job_text(theirs.job_id), ", this rank (",
               mine.process, ") to ", job_text(o.job_id()));
    PUSH_CHECK(theirs.world_size == n, kOrigin, them, " was started with WORLD_SIZE=", theirs.world_size,
               ", this rank (", mine.process, ") with WORLD_SIZE=", n);
    const bool one_side = given(theirs.fingerprint) != given(mine.fingerprint);
    PUSH_CHECK(!one_side && (!given(mine.fingerprint) || theirs.fingerprint == mine.fingerprint), kOrigin, them,
               " and this rank (", mine.process, ") were given ",
               one_side ? "PUSH_JOB_SECRET on one side only" : "different PUSH_JOB_SECRETs");
  };
  // The store's host says which job it serves: a rank of another job (two jobs on one
  // MASTER_PORT, its own rank 0 could not bind it) is refused at once and leaves the job
  // alone. Not under a launcher that hosts the store: that store outlives restarts (the job
  // id counts them).
  const bool own_store = !o.launcher_hosts_store();
  if (me == 0 && own_store) store.set("push/world/host", string_to_bytes(encode(mine)));
  if (me != 0 && own_store && arrives(store, "push/world/host", deadline)) {
    const Record host = decode(bytes_to_string(store.get("push/world/host")), 0);
    PUSH_CHECK(host.job_id == o.job_id(), kOrigin, "the store at ", where, " is hosted by ", host.process, " of ",
               job_text(host.job_id), "; this rank (", me, ", ", mine.process, ") belongs to ", job_text(o.job_id()),
               ": two jobs share MASTER_ADDR:MASTER_PORT. Give each job its own MASTER_PORT");
    try {
      check(host, 0);
    } catch (const Error&) {
      // Same job, started inconsistently: rank 0 names it too once it sees this record
      // (best effort: rank 0 may have gone already).
      try {
        store.set(key(o, c10::str("rank/", me)), string_to_bytes(encode(mine)));
      } catch (const std::exception&) {
      }
      throw;
    }
  }

  // Claim the rank number: the first process to add wins it.
  const std::string claim = key(o, c10::str("claim/", me));
  if (store.add(claim, 1) != 1) {
    std::string holder = "another process";
    const std::string other = key(o, c10::str("rank/", me));
    if (arrives(store, other, Clock::deadline_after(std::chrono::seconds(1)))) {
      const Record r = decode(bytes_to_string(store.get(other)), me);
      holder = c10::str(r.process, " (", job_text(r.job_id), ")");
    }
    throw Error(c10::str("[", kOrigin, "] rank ", me, " at ", where, " is taken by ", holder, "; this process is ",
                         mine.process, " (", job_text(o.job_id()),
                         "): two jobs share MASTER_ADDR:MASTER_PORT, or a rank was started twice. Give each job its "
                         "own MASTER_PORT (or its own PUSH_JOB_ID, so that it is refused at once)"));
  }
  store.set(key(o, c10::str("rank/", me)), string_to_bytes(encode(mine)));

  s.names.assign(n, "");
  std::string rank0_fingerprint;
  for (int r = 0; r < n; ++r) {
    const std::string k = key(o, c10::str("rank/", r));
    if (!arrives(store, k, deadline)) {
      std::vector<std::string> missing;
      for (int m = r; m < n; ++m) {
        if (!store.check({key(o, c10::str("rank/", m))})) missing.push_back(std::to_string(m));
      }
      const int refused = s.server ? s.server->refused() : 0;
      throw Error(c10::str("[", kOrigin, "] rank ", me, ": rank", missing.size() > 1 ? "s " : " ",
                           c10::Join(", ", missing), " did not join at ", where, " within ", o.init_timeout().count(),
                           " ms (init_timeout)", o.job_id().empty() ? "" : " in " + job_text(o.job_id()),
                           refused == 0 ? std::string()
                                        : c10::str("; ", refused,
                                                   " connection(s) to the store failed the job's secret proof (ranks "
                                                   "given different PUSH_JOB_SECRETs, or PUSH_JOB_SECRET on one side "
                                                   "only; or another local program)")));
    }
    const Record theirs = decode(bytes_to_string(store.get(k)), r);
    check(theirs, r);
    s.names[r] = theirs.name;
    if (r == 0) rank0_fingerprint = theirs.fingerprint;
  }
  if (o.job_secret().empty() && me != 0 && !own_store) {  // (push's own store: read before joining it)
    PUSH_CHECK(rank0_fingerprint.rfind('~', 0) == 0, kOrigin, "rank 0 published no fingerprint of a secret it drew");
    s.secret = secret_file::read(secret_file::path_for(o.master_addr(), o.master_port(), o.job_id()),
                                 rank0_fingerprint.substr(1));
  }
  std::set<std::string> unique(s.names.begin(), s.names.end());
  PUSH_CHECK(unique.size() == s.names.size(), kOrigin, "two ranks have the same name: ", c10::Join(", ", s.names));
}

}  // namespace push::dist::detail
