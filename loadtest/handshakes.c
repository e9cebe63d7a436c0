/*
 * handshakes: opens TLS connections one after the other for a given time and times each one, from
 * connect() to the end of the handshake. It does what `openssl s_time -new` / `-reuse` do (no request,
 * the socket closed without close_notify) and also gives the latency percentiles s_time does not.
 *
 *   handshakes HOST PORT SECONDS full|resumed [tls1.2]
 *
 * "resumed" does one full handshake, then offers its session on every connection after it and
 * counts those the server resumed; over TLS 1.3 (the default) it first reads the session tickets the
 * server sends after the handshake, as a browser does. Every timed handshake must negotiate what the
 * first did (version, cipher suite, key exchange group; a TLS 1.2 resumption reports its session's
 * group), or the run stops. "tls1.2" caps the version and offers ECDHE-ECDSA-AES128-GCM-SHA256 only.
 * Prints one line:
 *   connections N seconds S p50_ms X p99_ms Y resumed R protocol V cipher C group G
 * Built by loadtest/run: cc -O2 -std=c11 handshakes.c -lssl -lcrypto
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One connection: connect, handshake (offering session when not NULL), close. Returns the SSL's
 * session when keep is set (the caller frees it), whether the server resumed in *reused, and what
 * was negotiated in what ("protocol V cipher C group G"). */
static int handshake(SSL_CTX *ctx, const struct sockaddr_in *addr, SSL_SESSION *session, int *reused, SSL_SESSION **keep,
                     char *what, size_t capacity)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        perror("socket");
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) != 0) {
        perror("connect");
        close(fd);
        return -1;
    }
    SSL *ssl = SSL_new(ctx);
    int ok = ssl != NULL && SSL_set_fd(ssl, fd) == 1 && SSL_set_tlsext_host_name(ssl, "localhost") == 1
        && (session == NULL || SSL_set_session(ssl, session) == 1) && SSL_connect(ssl) == 1;
    if (ok) {
        *reused = SSL_session_reused(ssl);
        int group = SSL_get_negotiated_group(ssl);
        const char *name = group == 0 ? NULL : SSL_group_to_name(ssl, group);
        snprintf(what, capacity, "protocol %s cipher %s group %s", SSL_get_version(ssl), SSL_get_cipher_name(ssl),
                 name == NULL ? "none" : name);
        if (keep != NULL) {
            if (SSL_version(ssl) == TLS1_3_VERSION) {
                /* TLS 1.3 sends its session tickets after the handshake, so the session to resume
                 * is only there once they are read. The server sends no data after them: the read
                 * returns when the timeout runs out, once, before the timed connections. */
                struct timeval wait = {.tv_sec = 0, .tv_usec = 300000};
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
                char byte;
                (void)SSL_read(ssl, &byte, 1);
                ERR_clear_error();
            }
            *keep = SSL_get1_session(ssl);
            if (*keep == NULL || !SSL_SESSION_is_resumable(*keep)) {
                fprintf(stderr, "the server sent no session to resume\n");
                ok = 0;
            }
        }
        /* As s_time does: no close_notify, the socket is just closed. */
        SSL_set_shutdown(ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
    } else {
        ERR_print_errors_fp(stderr);
    }
    SSL_free(ssl);
    close(fd);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 5 || (strcmp(argv[4], "full") != 0 && strcmp(argv[4], "resumed") != 0)) {
        fprintf(stderr, "usage: %s HOST PORT SECONDS full|resumed [tls1.2]\n", argv[0]);
        return 2;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) {
        fprintf(stderr, "not an IPv4 address: %s\n", argv[1]);
        return 2;
    }
    double seconds = atof(argv[3]);
    int resume = strcmp(argv[4], "resumed") == 0;

    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    /* Over TLS 1.2 the client offers one cipher suite, the one browsers list first: servers that
     * choose by their own preference (Tern) and by the client's (nginx's default) would otherwise
     * resume with different suites and hash functions. */
    int tls12 = argc > 5 && strcmp(argv[5], "tls1.2") == 0;
    if (ctx == NULL || (tls12 && (SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION) != 1 ||
                                  SSL_CTX_set_cipher_list(ctx, "ECDHE-ECDSA-AES128-GCM-SHA256") != 1))) {
        ERR_print_errors_fp(stderr);
        return 1;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);

    SSL_SESSION *session = NULL;
    char first[128] = "", what[128];
    int reused = 0, status = 1;
    size_t count = 0, capacity = 4096, resumed = 0;
    double *times = malloc(capacity * sizeof *times);
    if (times == NULL || (resume && handshake(ctx, &addr, NULL, &reused, &session, what, sizeof what) != 0)) {
        goto done;
    }

    double start = now(), end = start + seconds, t;
    while ((t = now()) < end) {
        if (handshake(ctx, &addr, session, &reused, NULL, what, sizeof what) != 0) {
            goto done;
        }
        if (count == 0) {
            strcpy(first, what);
        } else if (strcmp(first, what) != 0) {
            fprintf(stderr, "handshake %zu negotiated %s; the first %s\n", count + 1, what, first);
            goto done;
        }
        if (count == capacity) {
            double *grown = realloc(times, 2 * capacity * sizeof *times);
            if (grown == NULL) {
                goto done;
            }
            times = grown;
            capacity *= 2;
        }
        times[count++] = now() - t;
        resumed += (size_t)reused;
    }
    double elapsed = now() - start;
    if (count == 0) {
        fprintf(stderr, "no connection in %.1f s\n", seconds);
        goto done;
    }
    qsort(times, count, sizeof *times, by_value);
    printf("connections %zu seconds %.3f p50_ms %.3f p99_ms %.3f resumed %zu %s\n", count, elapsed,
           times[count / 2] * 1000, times[count * 99 / 100] * 1000, resumed, first);
    status = 0;
done:
    free(times);
    SSL_SESSION_free(session);
    SSL_CTX_free(ctx);
    return status;
}
