#include <sys/types.h>
#include <curl/curl.h>
