#include <stddef.h>
#include <stdint.h>

/* libFuzzer's driver, for a program that has a main of its own (every Swift executable
   does): parses libFuzzer's flags from argv and calls `callback` for each input.
   https://llvm.org/docs/LibFuzzer.html#using-libfuzzer-as-a-library */
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
