using System.Buffers;

namespace Tern.Proxy.Tls.OpenSsl;

internal sealed partial class OpenSslConnection
{
    // TLS 1.2 GCM adds 29 bytes to a record (header, explicit nonce, tag), TLS 1.3 adds 22.
    private const int RecordOverhead = 64;

    // The smallest window worth handing to OpenSSL; below it the pipe starts a fresh block.
    private const int MinimumWindow = 512;

    // Reads that go straight to the socket after a hop found nothing to batch, before the next hop
    // tries again.
    private const int InlineReadsAfterLoneBatch = 8;

    // The most plaintext one TLS record carries.
    private const int FullRecord = 16 * 1024;

    /// <summary>
    /// Plaintext Kestrel wrote → records written by OpenSSL straight into the socket pipe's memory:
    /// records of up to 16 KB (OpenSSL's limit) out of each plaintext block (BlockPool's 32 KB), each
    /// written into the socket pipe's own pinned blocks, across two when it does not fit the rest of
    /// one. Nothing spills. Also the only writer of the socket pipe: it drains what the decrypt side
    /// spilled, and sends close_notify when Tern closes the connection. Not when the client's FIN
    /// came first (most clients close without close_notify): Kestrel then closes with nothing more
    /// to send, and on a socket the client has closed the record would only draw a reset. It cost a
    /// send, and a wakeup of the client, per connection; nginx does not send it either.
    /// </summary>
    /// <remarks>
    /// Before it encrypts, the loop may hop to the thread pool, letting the thread that flushed
    /// finish what it is doing first:
    /// <list type="bullet">
    /// <item>HTTP/2: on every read. The responses that completed with this one then go out in one
    /// send instead of one each (h2load -c8 -m32: 1.07 sends per request instead of 2, counting the
    /// upstream's; 0.83x the CPU per request).</item>
    /// <item>HTTP/1.1: only when a full record (16 KB) or more waits. A small response has nothing
    /// to wait for, and hopping cost it a thread-pool wakeup; a large one took 0.91x the CPU per
    /// 1 MB response with the hop (why is not known).</item>
    /// <item>A connection whose hop finds nothing more to send goes inline for its next eight
    /// reads. On HTTP/1.1 1 MB responses eight was the best of five rules measured: 0, 4, 8 and 16
    /// inline reads, and never hopping.</item>
    /// </list>
    /// The paired A/Bs behind each figure are in loadtest/README.md.
    /// </remarks>
    private async Task EncryptLoopAsync()
    {
        try
        {
            while (true)
            {
                var read = await _output.Reader.ReadAsync().ConfigureAwait(false);
                if (!read.IsCompleted && !read.IsCanceled)
                {
                    if (_inlineReads > 0)
                    {
                        _inlineReads--;
                    }
                    else if (_multiplexed || read.Buffer.Length >= FullRecord)
                    {
                        // Let the thread finish what it is doing (the other streams' responses
                        // that completed with this one), then take everything they wrote.
                        var before = read.Buffer.Length;
                        _output.Reader.AdvanceTo(read.Buffer.Start);
                        await Task.Yield();
                        if (!_output.Reader.TryRead(out read))
                        {
                            continue;
                        }

                        if (read.Buffer.Length == before)
                        {
                            // Nothing joined: one stream at a time. Skip the hop for a while.
                            _inlineReads = InlineReadsAfterLoneBatch;
                        }
                    }
                }

                DrainSpill(Volatile.Read(ref _pending));
                var buffer = read.Buffer;
                EncryptAll(buffer);
                _output.Reader.AdvanceTo(buffer.End);
                var flush = await _transport.Output.FlushAsync().ConfigureAwait(false);
                if (flush.IsCompleted || flush.IsCanceled)
                {
                    break;
                }

                if (read.IsCompleted)
                {
                    if (!Volatile.Read(ref _peerClosed))
                    {
                        SendCloseNotify();
                        flush = await _transport.Output.FlushAsync().ConfigureAwait(false);
                        _closeNotifySent = !flush.IsCompleted && !flush.IsCanceled;
                    }

                    break;
                }
            }

            await _output.Reader.CompleteAsync().ConfigureAwait(false);
            if (!_closeNotifySent)
            {
                // Else DisposeAsync closes, after a lingering close.
                await _transport.Output.CompleteAsync().ConfigureAwait(false);
            }
        }
        catch (Exception ex)
        {
            if (ex is OpenSslException)
            {
                // Counted and reported only if this pump's operation failed first; else the decrypt
                // pump failed the connection and OpenSSL refuses the SSL object from then on.
                if (FailedFirst(Operation.Encrypt, Operation.Shutdown))
                {
                    _metrics.ConnectionFailed("encrypt");
                    _abort(ex);
                }

                // The abort ends the connection. An exception handed to Kestrel's writer would be
                // logged as an unexpected error of its response flush; a completed flush is not.
                await _output.Reader.CompleteAsync().ConfigureAwait(false);
                await _transport.Output.CompleteAsync(ex).ConfigureAwait(false);
                return;
            }

            await _output.Reader.CompleteAsync(ex).ConfigureAwait(false);
            await _transport.Output.CompleteAsync(ex).ConfigureAwait(false);
        }
    }

    private void EncryptAll(ReadOnlySequence<byte> buffer)
    {
        // Counted once per batch, not per record: every connection adds to the same totals.
        long direct = 0;
        try
        {
            EncryptSegments(buffer, ref direct);
        }
        finally
        {
            _metrics.Direct(TlsMetrics.Direction.Encrypt, direct);
        }
    }

    private void EncryptSegments(ReadOnlySequence<byte> buffer, ref long direct)
    {
        foreach (var segment in buffer)
        {
            // One segment is one or two records (OpenSSL cuts them at 16 KB), each written across as
            // many of the socket pipe's blocks as it takes (two at most: a window is at least
            // MinimumWindow). The lock is held until the segment is out: the native side refuses a
            // decrypt while a record is half written.
            lock (_native)
            {
                var offset = 0;
                while (offset < segment.Length)
                {
                    var window = _transport.Output.GetMemory(MinimumWindow);
                    var call = Native(Operation.Encrypt, segment.Span[offset..], window.Span);
                    _transport.Output.Advance(call.Produced);
                    direct += call.Direct;
                    if (call.Status < 0)
                    {
                        throw new OpenSslException($"TLS error: {FailureReason}");
                    }

                    if (call.Consumed == 0 && call.Produced == 0 && call.Pending == 0)
                    {
                        throw new OpenSslException($"TLS engine made no progress (status {call.Status})");
                    }

                    offset += call.Consumed;
                    DrainSpill(call.Pending);
                }
            }
        }
    }

    private void SendCloseNotify()
    {
        var window = _transport.Output.GetMemory(RecordOverhead);
        var call = Native(Operation.Shutdown, default, window.Span);
        _transport.Output.Advance(call.Produced);
        _metrics.Direct(TlsMetrics.Direction.Shutdown, call.Direct);
        DrainSpill(call.Pending);
    }
}
