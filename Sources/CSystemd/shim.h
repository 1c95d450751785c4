// sd_notify(3) and sd_watchdog_enabled(3), from Debian's libsystemd-dev.
#include <systemd/sd-daemon.h>
