// The one translation unit that defines doctest's main(); the test cases live in test_*.cpp.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
