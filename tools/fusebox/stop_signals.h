// SIGINT (Ctrl-C) and SIGTERM (what schedulers send to pre-empt a job) while `fusebox train`
// trains: with a StopSignals in scope either one is a request to stop, which the training loop
// reads between steps (stop_signal()): the queued steps finish, the checkpoint is written, and
// the exit status is a shell's for a program the signal stopped (128 + the signal: 130, 143).
// The first signal counts; later ones change nothing (a signal sent to the process group, as
// `timeout` sends it, can arrive twice). SIGKILL cannot be caught: the checkpoint on disk stays
// whole either way (written by rename).
#pragma once

#include <signal.h>

namespace fusebox::cli {

class StopSignals {
 public:
  StopSignals();   // clears an earlier request and takes SIGINT and SIGTERM
  ~StopSignals();  // their previous actions again
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction previous_interrupt_ {};
  struct sigaction previous_terminate_ {};
};

// The signal that asked to stop, SIGINT or SIGTERM; 0 when none did.
int stop_signal();
// "SIGINT", "SIGTERM" ("another signal" for the rest: none other is taken).
const char* signal_name(int signal);

}  // namespace fusebox::cli
