// One server-side TLS connection over a custom BIO whose read side is a window
// over the caller's ciphertext and whose write side is a window over the
// caller's output; what does not fit goes to a spill buffer, drained first by
// the next call that has an output window.
#include "pal_internal.h"

#include <openssl/err.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

typedef struct TernSpill
{
    uint8_t* data;
    size_t start;
    size_t end;
    size_t capacity;
} TernSpill;

struct TernTlsConnection
{
    SSL* ssl;
    TernTlsServer* server;

    // Armed for one call only.
    const uint8_t* input;
    size_t inputLength;
    size_t inputOffset;
    uint8_t* output;
    size_t outputLength;
    size_t outputOffset;
    size_t spilled;
    size_t drained;

    // Set by Encrypt only: a record that does not fit the window waits for the next window
    // (OpenSSL keeps it and resumes) instead of spilling.
    int straddle;
    // A record is partly written and OpenSSL holds the rest until Encrypt is called again.
    int writePending;

    TernSpill spill;
    int clientCertificateRefused;
    char error[512];
};

static BIO_METHOD* s_bioMethod;
static pthread_once_t s_bioOnce = PTHREAD_ONCE_INIT;

static size_t SpillSize(const TernSpill* spill)
{
    return spill->end - spill->start;
}

static int SpillAppend(TernSpill* spill, const uint8_t* data, size_t length)
{
    if (spill->capacity - spill->end < length)
    {
        size_t used = SpillSize(spill);
        if (spill->start > 0)
        {
            memmove(spill->data, spill->data + spill->start, used);
            spill->start = 0;
            spill->end = used;
        }

        if (spill->capacity - used < length)
        {
            size_t capacity = spill->capacity == 0 ? 4096 : spill->capacity;
            while (capacity - used < length)
            {
                capacity *= 2;
            }

            uint8_t* grown = realloc(spill->data, capacity);
            if (grown == NULL)
            {
                return 0;
            }

            spill->data = grown;
            spill->capacity = capacity;
        }
    }

    memcpy(spill->data + spill->end, data, length);
    spill->end += length;
    return 1;
}

// Moves spilled bytes into the armed output window; frees the buffer once
// empty, so that idle connections hold no spill memory.
static void SpillDrain(TernTlsConnection* connection)
{
    TernSpill* spill = &connection->spill;
    size_t room = connection->outputLength - connection->outputOffset;
    size_t count = SpillSize(spill) < room ? SpillSize(spill) : room;
    if (count > 0)
    {
        memcpy(connection->output + connection->outputOffset, spill->data + spill->start, count);
        connection->outputOffset += count;
        connection->drained += count;
        spill->start += count;
    }

    if (SpillSize(spill) == 0 && spill->data != NULL)
    {
        free(spill->data);
        memset(spill, 0, sizeof(*spill));
    }
}

static int BioWrite(BIO* bio, const char* data, int length)
{
    TernTlsConnection* connection = BIO_get_data(bio);
    BIO_clear_retry_flags(bio);
    if (length <= 0)
    {
        return 0;
    }

    size_t size = (size_t)length;
    size_t direct = 0;
    // Bytes already spilled go out first: new bytes may only bypass an empty spill.
    if (SpillSize(&connection->spill) == 0 && connection->output != NULL)
    {
        size_t room = connection->outputLength - connection->outputOffset;
        direct = size < room ? size : room;
        memcpy(connection->output + connection->outputOffset, data, direct);
        connection->outputOffset += direct;
        if (connection->straddle && direct < size)
        {
            // The rest of this record goes into the caller's next window: OpenSSL keeps it and
            // writes it out when Encrypt is called again with the same input.
            if (direct == 0)
            {
                BIO_set_retry_write(bio);
                return -1;
            }

            return (int)direct;
        }
    }

    if (direct < size)
    {
        if (!SpillAppend(&connection->spill, (const uint8_t*)data + direct, size - direct))
        {
            // Take back the part already in the window: no half record may reach the wire.
            connection->outputOffset -= direct;
            return -1;
        }

        connection->spilled += size - direct;
    }

    return length;
}

static int BioRead(BIO* bio, char* buffer, int length)
{
    TernTlsConnection* connection = BIO_get_data(bio);
    BIO_clear_retry_flags(bio);
    size_t available = connection->input == NULL ? 0 : connection->inputLength - connection->inputOffset;
    if (available == 0 || length <= 0)
    {
        BIO_set_retry_read(bio);
        return -1;
    }

    size_t count = available < (size_t)length ? available : (size_t)length;
    memcpy(buffer, connection->input + connection->inputOffset, count);
    connection->inputOffset += count;
    return (int)count;
}

static long BioControl(BIO* bio, int command, long number, void* pointer)
{
    (void)bio;
    (void)number;
    (void)pointer;
    return command == BIO_CTRL_FLUSH ? 1 : 0;
}

static int BioCreate(BIO* bio)
{
    BIO_set_init(bio, 1);
    return 1;
}

static void CreateBioMethod(void)
{
    BIO_METHOD* method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "tern-window");
    if (method != NULL &&
        BIO_meth_set_write(method, BioWrite) == 1 &&
        BIO_meth_set_read(method, BioRead) == 1 &&
        BIO_meth_set_ctrl(method, BioControl) == 1 &&
        BIO_meth_set_create(method, BioCreate) == 1)
    {
        s_bioMethod = method;
    }
    else
    {
        BIO_meth_free(method);
    }
}

int32_t TernTls_ConnectionCreate(TernTlsServer* server, TernTlsConnection** connection)
{
    if (server == NULL || connection == NULL || server->count == 0)
    {
        return TERN_TLS_BAD_ARGUMENT;
    }

    *connection = NULL;
    ERR_clear_error();
    pthread_once(&s_bioOnce, CreateBioMethod);
    if (s_bioMethod == NULL)
    {
        return TERN_TLS_ERROR;
    }

    TernTlsConnection* created = calloc(1, sizeof(TernTlsConnection));
    if (created == NULL)
    {
        return TERN_TLS_NO_MEMORY;
    }

    created->ssl = SSL_new(server->contexts[0]);
    BIO* bio = BIO_new(s_bioMethod);
    if (created->ssl == NULL || bio == NULL)
    {
        BIO_free(bio);
        SSL_free(created->ssl);
        free(created);
        return TERN_TLS_NO_MEMORY;
    }

    BIO_set_data(bio, created);
    SSL_set_bio(created->ssl, bio, bio);
    SSL_set_accept_state(created->ssl);
    TernServerRetain(server);
    created->server = server;
    *connection = created;
    return TERN_TLS_OK;
}

void TernTls_ConnectionFree(TernTlsConnection* connection)
{
    if (connection == NULL)
    {
        return;
    }

    SSL_free(connection->ssl);
    TernTls_ServerRelease(connection->server);
    free(connection->spill.data);
    free(connection);
}

// A refused call still reports its status through result, so that a caller that
// reads only result never acts on stale counts.
static int32_t Refuse(TernTlsResult* result)
{
    if (result != NULL)
    {
        memset(result, 0, sizeof(*result));
        result->status = TERN_TLS_BAD_ARGUMENT;
    }

    return TERN_TLS_BAD_ARGUMENT;
}

static int ValidSpan(const uint8_t* data, int32_t length)
{
    return length >= 0 && (length == 0 || data != NULL);
}

static void Arm(TernTlsConnection* connection, const uint8_t* input, int32_t inputLength, uint8_t* output, int32_t outputLength)
{
    connection->input = input;
    connection->inputLength = (size_t)inputLength;
    connection->inputOffset = 0;
    connection->output = output;
    connection->outputLength = output == NULL ? 0 : (size_t)outputLength;
    connection->outputOffset = 0;
    connection->spilled = 0;
    connection->drained = 0;
    // SSL_get_error reads the thread's error queue, so nothing stale may be left in it; peeking
    // first is cheaper than clearing the queue's 16 slots on every call, and it is usually empty.
    if (ERR_peek_error() != 0)
    {
        ERR_clear_error();
    }
}

// Fills result and clears the windows: no caller pointer outlives the call.
static int32_t Finish(TernTlsConnection* connection, TernTlsResult* result, int32_t status, size_t consumed, size_t produced)
{
    result->status = status;
    result->consumed = (int32_t)consumed;
    result->produced = (int32_t)produced;
    result->spilled = (int32_t)connection->spilled;
    result->pending = (int32_t)SpillSize(&connection->spill);
    result->drained = (int32_t)connection->drained;
    connection->input = NULL;
    connection->output = NULL;
    connection->inputLength = connection->outputLength = 0;
    return status;
}

// Turns an SSL_get_error code into a status, keeping OpenSSL's reason.
static int32_t Failure(TernTlsConnection* connection, int code)
{
    switch (code)
    {
    case SSL_ERROR_WANT_READ:
        return TERN_TLS_WANT_READ;
    case SSL_ERROR_ZERO_RETURN:
        return TERN_TLS_CLOSED;
    default:
    {
        unsigned long last = ERR_peek_last_error();
        long verified = SSL_get_verify_result(connection->ssl);
        connection->clientCertificateRefused =
            verified != X509_V_OK ||
            (ERR_GET_LIB(last) == ERR_LIB_SSL && ERR_GET_REASON(last) == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE);
        // "certificate verify failed" alone does not say what was wrong with the client's
        // certificate: that comes first, so that a long error queue cannot cut it off.
        size_t used = 0;
        if (verified != X509_V_OK)
        {
            int written = snprintf(connection->error, sizeof(connection->error), "client certificate: %s; ",
                                   X509_verify_cert_error_string(verified));
            used = written < 0 ? 0 : ((size_t)written < sizeof(connection->error) ? (size_t)written : sizeof(connection->error) - 1);
        }

        TernDrainErrors(connection->error + used, sizeof(connection->error) - used);
        if (connection->error[0] == '\0')
        {
            snprintf(connection->error, sizeof(connection->error), "TLS failure (SSL_get_error %d)", code);
        }

        return TERN_TLS_ERROR;
    }
    }
}

int32_t TernTls_Handshake(TernTlsConnection* connection,
                          const uint8_t* input, int32_t inputLength,
                          uint8_t* output, int32_t outputLength,
                          TernTlsResult* result)
{
    if (connection == NULL || result == NULL || !ValidSpan(input, inputLength) || !ValidSpan(output, outputLength))
    {
        return Refuse(result);
    }

    Arm(connection, input, inputLength, output, outputLength);
    SpillDrain(connection);
    int32_t status = TERN_TLS_OK;
    if (!SSL_is_init_finished(connection->ssl))
    {
        int rc = SSL_do_handshake(connection->ssl);
        status = rc == 1 ? TERN_TLS_OK : Failure(connection, SSL_get_error(connection->ssl, rc));
        if (status == TERN_TLS_CLOSED)
        {
            status = TERN_TLS_ERROR;
        }
    }

    return Finish(connection, result, status, connection->inputOffset, connection->outputOffset);
}

int32_t TernTls_Decrypt(TernTlsConnection* connection,
                        const uint8_t* input, int32_t inputLength,
                        uint8_t* output, int32_t outputLength,
                        TernTlsResult* result)
{
    if (connection == NULL || result == NULL || !ValidSpan(input, inputLength) || output == NULL || outputLength <= 0)
    {
        // An empty output window would report "full, call again" forever.
        return Refuse(result);
    }

    if (connection->writePending)
    {
        // OpenSSL would flush the rest of the half-written record while reading (a KeyUpdate
        // reply, an alert), and the caller's retry would then encrypt that plaintext again.
        return Refuse(result);
    }

    // No output window for the BIO: anything OpenSSL writes now (alerts, KeyUpdate) spills.
    Arm(connection, input, inputLength, NULL, 0);
    if (SpillSize(&connection->spill) > TERN_TLS_UNREAD_ANSWERS_LIMIT)
    {
        // Records that OpenSSL must answer (TLS 1.2 renegotiation attempts draw a
        // no_renegotiation alert each), sent by a peer that does not read the answers, would
        // grow the spill buffer for as long as it sends: stop reading from it instead.
        snprintf(connection->error, sizeof(connection->error),
                 "the client does not read what TLS answers it (%zu bytes of alerts or handshake replies unread)",
                 SpillSize(&connection->spill));
        return Finish(connection, result, TERN_TLS_ERROR, 0, 0);
    }

    size_t produced = 0;
    int32_t status = TERN_TLS_OK;
    while (produced < (size_t)outputLength)
    {
        size_t read = 0;
        if (SSL_read_ex(connection->ssl, output + produced, (size_t)outputLength - produced, &read) == 1)
        {
            produced += read;
            continue;
        }

        status = Failure(connection, SSL_get_error(connection->ssl, 0));
        break;
    }

    return Finish(connection, result, status, connection->inputOffset, produced);
}

int32_t TernTls_Encrypt(TernTlsConnection* connection,
                        const uint8_t* input, int32_t inputLength,
                        uint8_t* output, int32_t outputLength,
                        TernTlsResult* result)
{
    if (connection == NULL || result == NULL || !ValidSpan(input, inputLength) || !ValidSpan(output, outputLength))
    {
        return Refuse(result);
    }

    Arm(connection, NULL, 0, output, outputLength);
    SpillDrain(connection);
    if (SpillSize(&connection->spill) > 0)
    {
        return Finish(connection, result, TERN_TLS_OUTPUT_FULL, 0, connection->outputOffset);
    }

    size_t written = 0;
    int32_t status = TERN_TLS_OK;
    if (inputLength > 0 && outputLength > 0)
    {
        connection->straddle = 1;
        int ok = SSL_write_ex(connection->ssl, input, (size_t)inputLength, &written);
        connection->straddle = 0;
        if (ok == 1)
        {
            connection->writePending = 0;
        }
        else if (SSL_get_error(connection->ssl, 0) == SSL_ERROR_WANT_WRITE)
        {
            // The window is full in the middle of a record: call again with a new window and
            // the same input; nothing of the input counts as consumed until the record is out.
            connection->writePending = 1;
            written = 0;
            status = TERN_TLS_OUTPUT_FULL;
        }
        else
        {
            status = Failure(connection, SSL_get_error(connection->ssl, 0));
        }
    }
    else if (inputLength > 0)
    {
        // No room at all: nothing of the input can go out (and a record begun earlier still waits
        // for its window), which is "call again with a window", not "done".
        status = TERN_TLS_OUTPUT_FULL;
    }

    return Finish(connection, result, status, written, connection->outputOffset);
}

int32_t TernTls_Shutdown(TernTlsConnection* connection, uint8_t* output, int32_t outputLength, TernTlsResult* result)
{
    if (connection == NULL || result == NULL || !ValidSpan(output, outputLength))
    {
        return Refuse(result);
    }

    if (connection->writePending)
    {
        return Refuse(result); // finish the half-written record first (Encrypt)
    }

    Arm(connection, NULL, 0, output, outputLength);
    SpillDrain(connection);
    int32_t status = TERN_TLS_OK;
    if (SSL_is_init_finished(connection->ssl) && !(SSL_get_shutdown(connection->ssl) & SSL_SENT_SHUTDOWN))
    {
        int rc = SSL_shutdown(connection->ssl);
        if (rc < 0)
        {
            status = Failure(connection, SSL_get_error(connection->ssl, rc));
        }
    }

    return Finish(connection, result, status == TERN_TLS_WANT_READ ? TERN_TLS_OK : status, 0, connection->outputOffset);
}

int32_t TernTls_ConnectionProtocol(TernTlsConnection* connection)
{
    return connection == NULL ? 0 : SSL_version(connection->ssl);
}

int32_t TernTls_ConnectionResumed(TernTlsConnection* connection)
{
    return connection == NULL ? 0 : SSL_session_reused(connection->ssl);
}

int32_t TernTls_ConnectionCipher(TernTlsConnection* connection, char* buffer, int32_t capacity)
{
    const char* name = connection == NULL ? NULL : SSL_get_cipher_name(connection->ssl);
    return name == NULL ? TernCopyText("", 0, buffer, capacity) : TernCopyText(name, strlen(name), buffer, capacity);
}

int32_t TernTls_ConnectionAlpn(TernTlsConnection* connection, char* buffer, int32_t capacity)
{
    const unsigned char* protocol = NULL;
    unsigned int length = 0;
    if (connection != NULL)
    {
        SSL_get0_alpn_selected(connection->ssl, &protocol, &length);
    }

    return TernCopyText((const char*)protocol, protocol == NULL ? 0 : length, buffer, capacity);
}

int32_t TernTls_ConnectionServerName(TernTlsConnection* connection, char* buffer, int32_t capacity)
{
    const char* name = connection == NULL ? NULL : SSL_get_servername(connection->ssl, TLSEXT_NAMETYPE_host_name);
    return TernCopyText(name == NULL ? "" : name, name == NULL ? 0 : strlen(name), buffer, capacity);
}

int32_t TernTls_ConnectionError(TernTlsConnection* connection, char* buffer, int32_t capacity)
{
    return connection == NULL ? -1 : TernCopyText(connection->error, strlen(connection->error), buffer, capacity);
}

int32_t TernTls_ConnectionPeerCertificate(TernTlsConnection* connection, uint8_t* buffer, int32_t capacity)
{
    X509* peer = connection == NULL ? NULL : SSL_get0_peer_certificate(connection->ssl);
    if (peer == NULL)
    {
        return 0;
    }

    int length = i2d_X509(peer, NULL);
    if (length <= 0)
    {
        return 0;
    }

    if (buffer == NULL || capacity < length)
    {
        return -length;
    }

    unsigned char* cursor = buffer;
    return i2d_X509(peer, &cursor);
}

int32_t TernTls_ConnectionPartialRecord(TernTlsConnection* connection)
{
    if (connection == NULL)
    {
        return 0;
    }

    // Part of a header or body read but not yet a whole record (SSL_has_pending, less plaintext
    // waiting to be read, which the caller drains before asking), or a whole header read and
    // none of its body: the record layer then holds nothing unread, only its state says so.
    SSL* ssl = connection->ssl;
    int unprocessed = SSL_pending(ssl) == 0 && SSL_has_pending(ssl);
    return unprocessed || strcmp(SSL_rstate_string(ssl), "RB") == 0 ? 1 : 0;
}

int32_t TernTls_ConnectionClientCertificateRefused(TernTlsConnection* connection)
{
    return connection != NULL && connection->clientCertificateRefused ? 1 : 0;
}
