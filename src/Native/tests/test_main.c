// Tests of libtern_tls's exports, run by CTest (and under ASan/UBSan in CI).
#include "tern_tls.h"

#include <stdio.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                      \
    do                                                                   \
    {                                                                    \
        if (!(cond))                                                     \
        {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,       \
                    __LINE__, #cond);                                    \
            failures++;                                                  \
        }                                                                \
    } while (0)

static void abi_version_is_current(void)
{
    CHECK(TernTls_AbiVersion() == TERN_TLS_ABI_VERSION);
}

static void openssl_is_version_3_or_later(void)
{
    CHECK(TernTls_OpenSslVersionNumber() >= 0x30000000L);
}

static void version_text_truncates_and_reports_full_length(void)
{
    char full[256];
    int32_t length = TernTls_OpenSslVersionText(full, (int32_t)sizeof(full));
    CHECK(length > 0 && strncmp(full, "OpenSSL 3", 9) == 0);

    char small[8];
    CHECK(TernTls_OpenSslVersionText(small, (int32_t)sizeof(small)) == length);
    CHECK(strlen(small) == sizeof(small) - 1);
    CHECK(TernTls_OpenSslVersionText(NULL, 10) == -1);
    CHECK(TernTls_OpenSslVersionText(small, 0) == -1);
}

int main(void)
{
    abi_version_is_current();
    openssl_is_version_3_or_later();
    version_text_truncates_and_reports_full_length();
    if (failures != 0)
    {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("tern_tls_tests: all checks passed\n");
    return 0;
}
