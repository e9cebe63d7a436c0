using System.Buffers;

namespace Tern.Proxy.Tls.OpenSsl;

internal sealed partial class OpenSslConnection
{
    /// <summary>
    /// Ciphertext from the socket pipe → plaintext written by OpenSSL straight into the memory of
    /// the application pipe that Kestrel's parsers read. What OpenSSL did not take stays in the
    /// socket pipe (AdvanceTo(consumed)); a record larger than the rest of the current block
    /// drains over as many windows as it needs, because a full window means "call again".
    /// </summary>
    private async Task DecryptLoopAsync()
    {
        Exception? failure = null;
        try
        {
            while (true)
            {
                var read = await _transport.Input.ReadAsync().ConfigureAwait(false);
                if (read.IsCanceled)
                {
                    // Stopped by DisposeAsync, which may read on (a lingering close).
                    _transport.Input.AdvanceTo(read.Buffer.Start);
                    break;
                }

                var buffer = read.Buffer;
                var (consumed, closed) = DecryptAvailable(buffer);
                _transport.Input.AdvanceTo(buffer.GetPosition(consumed), buffer.End);
                _peerSentCloseNotify |= closed;
                if (read.IsCompleted)
                {
                    // Before the plaintext pipe ends: Kestrel closes the connection when it sees
                    // the end, and the encrypt pump must know why by then.
                    Volatile.Write(ref _peerClosed, true);
                }

                var flush = await _input.Writer.FlushAsync().ConfigureAwait(false);
                if (read.IsCompleted && !closed)
                {
                    failure = Truncated();
                }

                if (closed || read.IsCompleted || flush.IsCompleted)
                {
                    break;
                }
            }
        }
        catch (Exception ex)
        {
            if (ex is OpenSslException)
            {
                // Abortive close: nothing more is trusted from this peer.
                if (FailedFirst(Operation.Decrypt))
                {
                    _metrics.ConnectionFailed("decrypt");
                    _abort(ex);
                }

                // Kestrel takes an IOException for a connection that broke (logged at Debug); any
                // other exception is "processing ended abnormally", a warning with a stack trace
                // that every client sending a bad record could write into the log.
                failure = new IOException(ex.Message, ex);
            }
            else
            {
                Volatile.Write(ref _peerClosed, true); // the socket failed: the peer is gone
                Truncated(); // counted when a reset cut a record short
                failure = ex;
            }
        }
        finally
        {
            await _input.Writer.CompleteAsync(failure).ConfigureAwait(false);
        }
    }

    /// <summary>
    /// The peer is gone. Between records that is an ordinary close (many clients skip
    /// close_notify); in the middle of one it is counted as a failure and the plaintext pipe ends
    /// with an error, so that a request cut short is not taken for a complete one.
    /// </summary>
    private IOException? Truncated()
    {
        bool partial;
        lock (_native)
        {
            partial = Interop.ConnectionPartialRecord(_handle) == 1;
        }

        if (!partial)
        {
            return null;
        }

        _metrics.ConnectionFailed(TlsMetrics.Truncated);
        return new IOException("The client closed the connection in the middle of a TLS record.");
    }

    private (long Consumed, bool Closed) DecryptAvailable(ReadOnlySequence<byte> buffer)
    {
        long produced = 0;
        try
        {
            return DecryptSegments(buffer, ref produced);
        }
        finally
        {
            // Once per read, not per record (see EncryptAll).
            _metrics.Direct(TlsMetrics.Direction.Decrypt, produced);
        }
    }

    private (long Consumed, bool Closed) DecryptSegments(ReadOnlySequence<byte> buffer, ref long produced)
    {
        long consumed = 0;
        foreach (var segment in buffer)
        {
            var offset = 0;
            while (true)
            {
                var window = _input.Writer.GetMemory();
                var call = Native(Operation.Decrypt, segment.Span[offset..], window.Span);
                offset += call.Consumed;
                _input.Writer.Advance(call.Produced);
                produced += call.Produced;
                if (call.Pending > 0)
                {
                    // OpenSSL answered something (KeyUpdate, alert) while reading: the encrypt pump owns
                    // the socket pipe's writer, so wake it to send those bytes.
                    _output.Reader.CancelPendingRead();
                }

                switch (call.Status)
                {
                    case Interop.Ok:
                        continue; // the window filled up: more plaintext may be waiting
                    case Interop.WantRead:
                        break;
                    case Interop.Closed:
                        return (consumed + offset, true);
                    default:
                        throw new OpenSslException($"TLS error: {FailureReason}");
                }

                break;
            }

            consumed += offset;
        }

        return (consumed, false);
    }
}
