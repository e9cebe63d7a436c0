// handshake_cost: the server side of full TLS 1.3 handshakes, done in one process over memory by
// two servers with the same ECDSA P-256 certificate and the same OpenSSL client: libtern_tls, set
// up as the proxy sets it up, and a plain OpenSSL server set up as nginx 1.22 sets up its own
// (OpenSSL's built-in session ticket keys, no session cache, SSL_MODE_RELEASE_BUFFERS). It answers
// one question: does Tern's engine make OpenSSL do more work per handshake than nginx does?
//
//   handshake_cost tern|plain|both [HANDSHAKES [ROUNDS]]
//
// Alone, it prints the server side's CPU time per handshake, round by round, alternating the two
// servers (noisy on a shared machine). Under callgrind it counts instructions, which noise does not
// change; everything a server does goes through ServerTern or ServerPlain:
//
//   valgrind --tool=callgrind --collect-atstart=no --toggle-collect=ServerTern
//            --toggle-collect=ServerPlain handshake_cost tern 100 1       (one command)
//
// and again with "plain". Each run's "Collected" total divided by the handshakes it made (the 100,
// plus as many again for warm-up, at most 50) is the instructions per handshake; callgrind_annotate
// splits them by library and function. CTest runs it briefly (both 20 1) so that it keeps working;
// loadtest/README.md has the figures.
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include "tern_tls.h"
#include "test_pki.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static SSL_CTX* s_client;
static SSL_CTX* s_plain;
static TernTlsServer* s_tern;
static double s_serverSeconds;
static unsigned char s_flight[64 * 1024];
static unsigned char s_reply[64 * 1024];

static double CpuNow(void)
{
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static void Fail(const char* what)
{
    fprintf(stderr, "handshake_cost: %s\n", what);
    ERR_print_errors_fp(stderr);
    exit(1);
}

// The client's half: memory BIOs both ways, TLS 1.3 only, no session to offer.
static SSL* NewClient(BIO** toClient, BIO** fromClient)
{
    SSL* ssl = SSL_new(s_client);
    *toClient = BIO_new(BIO_s_mem());
    *fromClient = BIO_new(BIO_s_mem());
    if (ssl == NULL || *toClient == NULL || *fromClient == NULL)
    {
        Fail("cannot make the client");
    }

    SSL_set_bio(ssl, *toClient, *fromClient);
    SSL_set_connect_state(ssl);
    SSL_set_tlsext_host_name(ssl, "localhost");
    return ssl;
}

// Everything a server does for a connection happens in one of these (callgrind's toggle): step 0
// creates the connection, a negative step frees it, any other takes the client's length bytes
// from s_flight. Each returns 1 once the handshake is done, 0 while it wants more, -1 on failure;
// Tern's writes its reply into s_reply (*produced bytes). Not static, so that callgrind can name them.
__attribute__((noinline)) int ServerTern(void** connection, int step, int32_t length, int32_t* produced);
__attribute__((noinline)) int ServerPlain(void** connection, int step, int32_t length, int32_t* produced);

int ServerTern(void** connection, int step, int32_t length, int32_t* produced)
{
    if (step == 0)
    {
        return TernTls_ConnectionCreate(s_tern, (TernTlsConnection**)connection) == TERN_TLS_OK ? 0 : -1;
    }

    if (step < 0)
    {
        TernTls_ConnectionFree(*connection);
        return 0;
    }

    TernTlsResult result;
    memset(&result, 0, sizeof(result));
    int32_t status = TernTls_Handshake(*connection, s_flight, length, s_reply, (int32_t)sizeof(s_reply), &result);
    *produced = result.produced;
    return status == TERN_TLS_OK ? 1 : status == TERN_TLS_WANT_READ ? 0 : -1;
}

int ServerPlain(void** connection, int step, int32_t length, int32_t* produced)
{
    (void)length;
    (void)produced; // the reply stays in the server's memory BIO until PlainCollect
    if (step == 0)
    {
        SSL* ssl = SSL_new(s_plain);
        BIO* input = BIO_new(BIO_s_mem());
        BIO* output = BIO_new(BIO_s_mem());
        *connection = ssl;
        if (ssl == NULL || input == NULL || output == NULL)
        {
            return -1;
        }

        SSL_set_bio(ssl, input, output);
        SSL_set_accept_state(ssl);
        return 0;
    }

    if (step < 0)
    {
        SSL_free(*connection);
        return 0;
    }

    int rc = SSL_do_handshake(*connection);
    return rc == 1 ? 1 : SSL_get_error(*connection, rc) == SSL_ERROR_WANT_READ ? 0 : -1;
}

// The plain server's bytes cross memory BIOs, as nginx's cross the kernel: outside the timed part,
// as Tern's windows are the caller's own.
static void PlainDeliver(void* connection, int32_t length)
{
    BIO_write(SSL_get_rbio(connection), s_flight, length);
}

static int32_t PlainCollect(void* connection)
{
    int length = BIO_read(SSL_get_wbio(connection), s_reply, (int)sizeof(s_reply));
    return length < 0 ? 0 : length;
}

typedef struct Server
{
    const char* name;
    int (*call)(void** connection, int step, int32_t length, int32_t* produced);
    void (*deliver)(void* connection, int32_t length); // NULL: the server reads s_flight itself
    int32_t (*collect)(void* connection);              // NULL: the server writes s_reply itself
} Server;

static const Server s_servers[] = {
    {"tern", ServerTern, NULL, NULL},
    {"plain", ServerPlain, PlainDeliver, PlainCollect},
};

// Times a server's calls only; the client's work and the bytes' transfer are not counted.
static int Timed(const Server* server, void** connection, int step, int32_t length, int32_t* produced)
{
    double start = CpuNow();
    int state = server->call(connection, step, length, produced);
    s_serverSeconds += CpuNow() - start;
    return state;
}

static void OneHandshake(const Server* server)
{
    BIO* toClient;
    BIO* fromClient;
    SSL* client = NewClient(&toClient, &fromClient);
    void* connection = NULL;
    int32_t produced = 0;
    if (Timed(server, &connection, 0, 0, &produced) != 0)
    {
        fprintf(stderr, "handshake_cost: %s: ", server->name);
        Fail("no connection");
    }

    int state = 0;
    for (int step = 1; step < 8 && state == 0; step++)
    {
        (void)SSL_do_handshake(client);
        int length = BIO_read(fromClient, s_flight, (int)sizeof(s_flight));
        length = length < 0 ? 0 : length;
        if (server->deliver != NULL && length > 0)
        {
            server->deliver(connection, length);
        }

        produced = 0;
        state = Timed(server, &connection, step, length, &produced);
        if (server->collect != NULL)
        {
            produced = server->collect(connection);
        }

        if (produced > 0)
        {
            BIO_write(toClient, s_reply, produced);
        }
    }

    (void)SSL_do_handshake(client);
    if (state != 1 || SSL_is_init_finished(client) != 1)
    {
        fprintf(stderr, "handshake_cost: %s: ", server->name);
        Fail("the handshake did not finish");
    }

    Timed(server, &connection, -1, 0, &produced);
    SSL_free(client);
}

// nginx 1.22's setup of a server with ssl_certificate and ssl_protocols and no ssl_session_cache.
static SSL_CTX* PlainContext(const Pem* pem)
{
    SSL_CTX* context = SSL_CTX_new(TLS_server_method());
    BIO* certificateBio = BIO_new_mem_buf(pem->certificate, pem->certificateLength);
    BIO* keyBio = BIO_new_mem_buf(pem->key, pem->keyLength);
    X509* certificate = PEM_read_bio_X509(certificateBio, NULL, NULL, NULL);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(keyBio, NULL, NULL, NULL);
    if (context == NULL || SSL_CTX_use_certificate(context, certificate) != 1 || SSL_CTX_use_PrivateKey(context, key) != 1)
    {
        Fail("cannot set up the plain server");
    }

    SSL_CTX_set_options(context, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(context, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_NO_AUTO_CHAIN);
    SSL_CTX_set_session_cache_mode(context, SSL_SESS_CACHE_OFF);
    X509_free(certificate);
    EVP_PKEY_free(key);
    BIO_free(certificateBio);
    BIO_free(keyBio);
    return context;
}

int main(int argc, char** argv)
{
    const char* which = argc > 1 ? argv[1] : "both";
    int perRound = argc > 2 ? atoi(argv[2]) : 500;
    int rounds = argc > 3 ? atoi(argv[3]) : 6;
    int runTern = strcmp(which, "tern") == 0 || strcmp(which, "both") == 0;
    int runPlain = strcmp(which, "plain") == 0 || strcmp(which, "both") == 0;
    if ((!runTern && !runPlain) || perRound <= 0 || rounds <= 0)
    {
        fprintf(stderr, "usage: handshake_cost tern|plain|both [HANDSHAKES [ROUNDS]]\n");
        return 2;
    }

    Pem pem = MakeCertificate("localhost");
    s_client = SSL_CTX_new(TLS_client_method());
    if (s_client == NULL || SSL_CTX_set_min_proto_version(s_client, TLS1_3_VERSION) != 1)
    {
        Fail("cannot set up the client");
    }

    SSL_CTX_set_session_cache_mode(s_client, SSL_SESS_CACHE_OFF);

    // Tern as the proxy sets it up: ALPN h2 and http/1.1, one certificate.
    static const uint8_t alpn[] = "\x02h2\x08http/1.1";
    if (TernTls_ServerCreate(alpn, (int32_t)sizeof(alpn) - 1, NULL, NULL, &s_tern) != TERN_TLS_OK ||
        TernTls_ServerAddCertificate(s_tern, (const uint8_t*)pem.certificate, pem.certificateLength,
                                     (const uint8_t*)pem.key, pem.keyLength) != TERN_TLS_OK)
    {
        Fail("cannot set up Tern's server");
    }

    s_plain = PlainContext(&pem);

    int warmUp = perRound < 50 ? perRound : 50;
    for (int i = 0; i < warmUp; i++)
    {
        if (runTern)
        {
            OneHandshake(&s_servers[0]);
        }

        if (runPlain)
        {
            OneHandshake(&s_servers[1]);
        }
    }

    for (int round = 0; round < rounds; round++)
    {
        // Each round starts with the other server, so that neither always follows the other.
        for (int side = 0; side < 2; side++)
        {
            int tern = (side == 0) == (round % 2 == 0);
            if ((tern && !runTern) || (!tern && !runPlain))
            {
                continue;
            }

            const Server* server = &s_servers[tern ? 0 : 1];
            s_serverSeconds = 0;
            for (int i = 0; i < perRound; i++)
            {
                OneHandshake(server);
            }

            printf("round %d %-5s %.1f us of server CPU per handshake\n", round, server->name,
                   s_serverSeconds * 1e6 / perRound);
        }
    }

    TernTls_ServerRelease(s_tern);
    SSL_CTX_free(s_plain);
    SSL_CTX_free(s_client);
    FreePem(&pem);
    return 0;
}
