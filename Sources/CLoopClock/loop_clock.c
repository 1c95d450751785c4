#include "CLoopClock.h"

__thread long long sluice_loop_clock = -1;
