#pragma once
// How rank 0 hands a secret it drew to the job's other ranks when no PUSH_JOB_SECRET was
// given (ranks started by hand or by mpirun/srun on hosts that share rank 0's file system):
// through a file of mode 0600 in a folder only this user owns, never through the store,
// which any local user can read (docs/distributed.md, "The job secret").
//
// The folder is $XDG_RUNTIME_DIR/push when that is this user's private folder, else
// /tmp/push-<uid>; either is refused unless it is a real folder (not a link) owned by this
// user with no permissions for anyone else, so another user cannot plant or read a file in
// it. The file's name derives from MASTER_ADDR, MASTER_PORT and the job id; rank 0 writes it
// before it publishes its record (which carries the secret's fingerprint) and removes it
// when it leaves; the others read it after that record and check the fingerprint.
#include <optional>
#include <string>

#include "dist/transport/handshake.h"

namespace push::dist::detail::secret_file {

/// The file for the job at `master_addr`:`port` with id `job_id` (creating this user's
/// private folder when it is missing). Throws push::Error naming a folder that is not private.
std::string path_for(const std::string& master_addr, int port, const std::string& job_id);

/// Writes `secret` to `path` (mode 0600, replaced atomically). Throws push::Error naming the path.
void write(const std::string& path, const handshake::Bytes& secret);

/// The secret in `path`, which must be a regular file of this user's with no permissions
/// for anyone else, and have `fingerprint` (handshake::fingerprint). Throws push::Error
/// saying what is wrong and how to give the job a secret instead.
handshake::Bytes read(const std::string& path, const std::string& fingerprint);

/// Like read, with no fingerprint to check (the store's handshake proves it instead), and
/// nothing when there is no file at `path` yet.
std::optional<handshake::Bytes> try_read(const std::string& path);

}  // namespace push::dist::detail::secret_file
