#include <sys/types.h>
#include <crypt.h>
