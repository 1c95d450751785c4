// hiredis 0.14 (Debian's libhiredis-dev): the asynchronous API and its libevent adapter (static
// functions in the header, compiled into the module that imports them).
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>
