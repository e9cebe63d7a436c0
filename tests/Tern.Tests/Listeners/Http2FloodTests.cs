using System.Net;
using Tern.Proxy.Telemetry;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Listeners;

/// <summary>
/// An HTTP/2 client that opens and resets streams faster than Kestrel can clear them: Kestrel
/// closes its connection, and Tern logs it once per 10 s at Warning instead of Kestrel's ~100
/// Critical lines per connection (<see cref="LogFloods"/>).
/// </summary>
public sealed class Http2FloodTests
{
    [Fact]
    public async Task StreamResetFlood_ConnectionClosed_OneWarningLine_NoCritical()
    {
        await using var upstream = await TestUpstream.StartAsync();
        await using var tern = await TernInstance.StartAsync(TernConfig.To(Proxy.Tls.TlsEngines.OpenSsl, upstream));
        const string Line = "exceeded the output operations maximum queue size";

        // Each connection: 2,000 streams opened and reset in one write. Kestrel's writer usually
        // falls behind on the first; a few more make sure of it on a busy machine.
        for (var connection = 0; connection < 10 && !tern.Logs.Lines.Any(l => l.Contains(Line, StringComparison.Ordinal)); connection++)
        {
            await FloodAsync(tern.Config.HttpsPort);
        }

        await tern.Logs.WaitForAsync(Line);
        await FloodAsync(tern.Config.HttpsPort); // within 10 s of the first: left out
        await Task.Delay(500);

        Assert.Equal(Proxy.Tls.TlsEngines.OpenSsl, tern.Config.Engine);
        var line = Assert.Single(tern.Logs.Lines, l => l.Contains(Line, StringComparison.Ordinal));
        Assert.StartsWith("Warning: Microsoft.AspNetCore.Server.Kestrel.Http2: ", line, StringComparison.Ordinal);
        Assert.Contains("the client reset HTTP/2 streams faster than they could be cleared", line, StringComparison.Ordinal);
        Assert.DoesNotContain(tern.Logs.Lines, l => l.StartsWith("Critical", StringComparison.Ordinal));

        // Nothing else suffered: a new HTTP/2 connection is served.
        using var client = tern.CreateClient(version: HttpVersion.Version20);
        Assert.Equal(HttpStatusCode.OK, (await client.GetAsync("/name")).StatusCode);
    }

    [Fact]
    public async Task OtherKestrelHttp2Lines_PassAsTheyAre_Event60_OncePerWindow_TheCountLeftOutAtItsEnd()
    {
        var capture = new LogCapture();
        using var factory = new LogFloods(LoggerFactory.Create(b => b.AddProvider(capture).SetMinimumLevel(LogLevel.Debug)), kestrelWindow: TimeSpan.FromMilliseconds(500));
        var logger = factory.CreateLogger(LogFloods.KestrelHttp2);

        logger.Log(LogLevel.Critical, new EventId(61, "Http2UnexpectedDataRemaining"), "unexpected state", null, (s, _) => s);
        var exception = new InvalidOperationException("never thrown");
        logger.Log(LogLevel.Critical, new EventId(60), "flood one", exception, (s, e) => s + (e is null ? "" : " with exception"));
        logger.Log(LogLevel.Critical, new EventId(60), "flood two", null, (s, _) => s);
        logger.Log(LogLevel.Critical, new EventId(60), "flood three", null, (s, _) => s);
        var kestrel = factory.CreateLogger("Microsoft.AspNetCore.Server.Kestrel");
        kestrel.Log(LogLevel.Critical, new EventId(60), "another category", null, (s, _) => s);
        await LineWait.WaitForAsync(capture.Lines, "came 2 more times", null, () => string.Join("\n", capture.Lines)); // the window's end: its count
        logger.Log(LogLevel.Critical, new EventId(60), "flood four", null, (s, _) => s);

        Assert.Equal(
            [
                "Critical: Microsoft.AspNetCore.Server.Kestrel.Http2: unexpected state",
                "Warning: Microsoft.AspNetCore.Server.Kestrel.Http2: flood one Kestrel closed it: the client reset HTTP/2 streams faster than they could be cleared (a flood). At most one such line every 0.5 s; how many more came follows at the end of that time.",
                "Critical: Microsoft.AspNetCore.Server.Kestrel: another category",
                "Warning: Microsoft.AspNetCore.Server.Kestrel.Http2: Kestrel's line for an HTTP/2 flood (event 60) came 2 more times in the 0.5 s after the last one written, and was left out.",
                "Warning: Microsoft.AspNetCore.Server.Kestrel.Http2: flood four Kestrel closed it: the client reset HTTP/2 streams faster than they could be cleared (a flood). At most one such line every 0.5 s; how many more came follows at the end of that time.",
            ],
            capture.Lines);
    }

    /// <summary>The count is written on a timer's thread, where a logger's exception would end the process.</summary>
    [Fact]
    public async Task ALoggerThatThrows_DoesNotEndTheProcessAtTheWindowsEnd()
    {
        var failing = new FailingProvider();
        using var factory = new LogFloods(LoggerFactory.Create(b => b.AddProvider(failing)), kestrelWindow: TimeSpan.FromMilliseconds(200));
        var logger = factory.CreateLogger(LogFloods.KestrelHttp2);
        Assert.ThrowsAny<Exception>(() => logger.Log(LogLevel.Critical, new EventId(60), "flood one", null, (s, _) => s)); // to the caller, as before
        logger.Log(LogLevel.Critical, new EventId(60), "flood two", null, (s, _) => s); // left out: the timer is armed
        await Task.Delay(600);
        Assert.Equal(2, failing.Calls); // the count was tried, and its exception went nowhere
    }

    private sealed class FailingProvider : ILoggerProvider, ILogger
    {
        private int _calls;

        public int Calls => Volatile.Read(ref _calls);

        public ILogger CreateLogger(string categoryName) => this;

        public void Dispose()
        {
        }

        public IDisposable? BeginScope<TState>(TState state)
            where TState : notnull => null;

        public bool IsEnabled(LogLevel logLevel) => true;

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            Interlocked.Increment(ref _calls);
            throw new IOException("disk full");
        }
    }

    private static async Task FloodAsync(int port)
    {
        await using var client = await RawHttp.ConnectAsync(port, http2: true);
        var block = Http2Frames.HeaderBlock([(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", "/anything")]);
        var output = new MemoryStream();
        Http2Frames.WritePreface(output);
        for (var stream = 1; stream < 4000; stream += 2)
        {
            Http2Frames.WriteFrame(output, Http2Frames.Headers, Http2Frames.EndHeaders | Http2Frames.EndStream, stream, block);
            Http2Frames.WriteFrame(output, Http2Frames.RstStream, 0, stream, [0, 0, 0, 8]); // CANCEL
        }

        try
        {
            await client.WriteAsync(output.ToArray());
            using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(5));
            while (await Http2Frames.ReadFrameAsync(client.Stream, timeout.Token) is not null)
            {
            }
        }
        catch (Exception e) when (e is IOException or OperationCanceledException)
        {
            // Kestrel closed the connection, which is the point.
        }
    }
}
