using System.Net;
using Tern.Proxy.Telemetry;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Telemetry;

/// <summary>
/// Tern's per-request lines (Tern.Proxy.Forwarding, events 300-399), which a client can cause at
/// will, are written at most <see cref="LogFloods.RequestLinesPerSecond"/> times per second each,
/// and the rest counted in one line at the second's end (<see cref="LogFloods"/>; Kestrel's HTTP/2
/// flood line, the same mechanism, is Listeners/Http2FloodTests).
/// </summary>
public sealed class LogFloodsTests
{
    [Fact]
    public async Task EachEventHasItsOwnBudget_TheCountLeftOutAtTheWindowsEnd_OtherLinesPass()
    {
        var capture = new LogCapture();
        using var factory = new LogFloods(LoggerFactory.Create(b => b.AddProvider(capture).SetMinimumLevel(LogLevel.Debug)), requestWindow: TimeSpan.FromMilliseconds(500));
        Assert.Same(factory.CreateLogger(LogFloods.Forwarding), factory.CreateLogger(LogFloods.Forwarding)); // asked for on every request it logs

        var logger = factory.CreateLogger(LogFloods.Forwarding);
        for (var i = 1; i <= 13; i++)
        {
            logger.Log(LogLevel.Warning, new EventId(301), i, null, (n, _) => $"upstream {n}");
            logger.Log(LogLevel.Information, new EventId(300), i, null, (n, _) => $"client {n}");
        }

        logger.Log(LogLevel.Information, new EventId(400), "not per request", null, (s, _) => s);
        factory.CreateLogger("Tern.Proxy.Tls").Log(LogLevel.Debug, new EventId(301), "another category", null, (s, _) => s);
        await LineWait.WaitForAsync(capture.Lines, "Event 300 came 3 more times", null, () => string.Join("\n", capture.Lines));
        await LineWait.WaitForAsync(capture.Lines, "Event 301 came 3 more times", null, () => string.Join("\n", capture.Lines));
        logger.Log(LogLevel.Warning, new EventId(301), "upstream 14", null, (s, _) => s); // a new window

        var lines = capture.Lines.ToList();
        Assert.Equal([.. Enumerable.Range(1, 10).Select(i => $"Warning: Tern.Proxy.Forwarding: upstream {i}"), "Warning: Tern.Proxy.Forwarding: upstream 14"], lines.Where(l => l.Contains(": upstream", StringComparison.Ordinal)));
        Assert.Equal(Enumerable.Range(1, 10).Select(i => $"Information: Tern.Proxy.Forwarding: client {i}"), lines.Where(l => l.Contains(": client", StringComparison.Ordinal)));
        Assert.Contains("Information: Tern.Proxy.Forwarding: not per request", lines);
        Assert.Contains("Debug: Tern.Proxy.Tls: another category", lines);
        // Each count at its event's level.
        Assert.Contains("Information: Tern.Proxy.Forwarding: Event 300 came 3 more times within 0.5 s of its first line, beyond the 10 written, and was left out (Tern writes at most 10 lines of each per-request event per 0.5 s; the metrics count every request).", lines);
        Assert.Contains(lines, l => l.StartsWith("Warning: Tern.Proxy.Forwarding: Event 301 came 3 more times within 0.5 s", StringComparison.Ordinal));
    }

    /// <summary>
    /// YARP's failed-probe line (event 17): one for each destination per window, its count naming
    /// the destination; windows of destinations that went quiet are dropped once there are many,
    /// so that destinations a reload removed do not pile up.
    /// </summary>
    [Fact]
    public async Task FailedProbes_OneLineForEachDestination_QuietOnesDroppedPastTheLimit()
    {
        var capture = new LogCapture();
        using var factory = new LogFloods(LoggerFactory.Create(b => b.AddProvider(capture).SetMinimumLevel(LogLevel.Debug)), probeWindow: TimeSpan.FromMilliseconds(300));
        var logger = factory.CreateLogger(LogFloods.YarpHealthProbes);
#pragma warning disable CA1727 // YARP 2.1's own template, whose names the rule keys its windows by
        var failed = LoggerMessage.Define<string, string>(LogLevel.Warning, new EventId(LogFloods.YarpProbeFailed), "Probing destination `{destinationId}` on cluster `{clusterId}` failed.");
#pragma warning restore CA1727
        var refused = new HttpRequestException("Connection refused (10.0.0.5:8080)");

        failed(logger, "d1", "app", refused);
        failed(logger, "d1", "app", refused);
        failed(logger, "d2", "app", refused);
        await LineWait.WaitForAsync(capture.Lines, "YARP's active health probes of destination `d1` on cluster `app` failed 1 more time in the 0.3 s", null, () => string.Join("\n", capture.Lines));

        Assert.Single(capture.Lines, l => l.Contains("Probing destination `d1` on cluster `app` failed. Connection refused (10.0.0.5:8080). At most one such line for each destination every 0.3 s", StringComparison.Ordinal));
        Assert.Single(capture.Lines, l => l.Contains("Probing destination `d2` on cluster `app` failed. Connection refused", StringComparison.Ordinal));
        Assert.DoesNotContain(capture.Lines, l => l.Contains("probes of destination `d2`", StringComparison.Ordinal)); // nothing left out for d2

        for (var i = 0; i < LogFloods.KeyedWindows; i++)
        {
            failed(logger, $"gone{i}", "app", refused);
        }

        Assert.Equal(LogFloods.KeyedWindows, factory.KeyedWindowCount(LogFloods.YarpHealthProbes)); // d1's and d2's, quiet by then, dropped to make room
        await Task.Delay(400); // every window's time over
        failed(logger, "new", "app", refused);
        Assert.Equal(1, factory.KeyedWindowCount(LogFloods.YarpHealthProbes));
    }

    /// <summary>A dead upstream under load: one line per request before, now at most 10 a second and the count.</summary>
    [Fact]
    public async Task DeadUpstream_ManyRequests_TenLinesAndACount()
    {
        var dead = FreePort.Next();
        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl).Route("all", "dead", "{**any}").Cluster("dead", [$"http://127.0.0.1:{dead}/"]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        const int Requests = 200;
        var statuses = await Task.WhenAll(Enumerable.Range(0, Requests).Select(async _ =>
        {
            using var response = await client.GetAsync(new Uri("/x", UriKind.Relative));
            return response.StatusCode;
        }));
        Assert.All(statuses, s => Assert.Equal(HttpStatusCode.BadGateway, s));

        await tern.Logs.WaitForAsync("Event 301 came ");
        await Task.Delay(1500); // any later window's count
        var written = tern.Logs.Lines.Count(l => l.Contains("GET /x returned 502: the upstream refused the connection", StringComparison.Ordinal));
        var counted = tern.Logs.Lines.Where(l => l.Contains("Event 301 came ", StringComparison.Ordinal))
            .Sum(l => int.Parse(l.Split("Event 301 came ")[1].Split(' ')[0], System.Globalization.CultureInfo.InvariantCulture));
        Assert.Equal(Requests, written + counted); // every request accounted for
        Assert.InRange(written, 10, Requests / 2);
    }
}
