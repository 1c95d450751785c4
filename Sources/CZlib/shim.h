#include <sys/types.h>
#include <zlib.h>
