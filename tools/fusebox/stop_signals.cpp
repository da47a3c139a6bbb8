#include "stop_signals.h"

#include <csignal>

namespace fusebox::cli {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int signal) {
  if (g_stop_signal == 0) g_stop_signal = signal;
}

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART;  // a read or write the signal interrupts goes on
  ::sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, &previous_interrupt_);
  ::sigaction(SIGTERM, &action, &previous_terminate_);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &previous_interrupt_, nullptr);
  ::sigaction(SIGTERM, &previous_terminate_, nullptr);
}

int stop_signal() {
  return g_stop_signal;
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "another signal";
  }
}

}  // namespace fusebox::cli
