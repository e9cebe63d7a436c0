using System.Globalization;
using System.Net;
using System.Net.Sockets;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Listeners;

/// <summary>
/// The real proxy process allowed few open files, and more clients than it may hold: each accepted
/// connection is a file. Tern stops accepting before the last eighth of its descriptors (64 of 500
/// here) is gone, so that upstream connections, files and the runtime's threads still get theirs,
/// and clients wait in the backlog.
/// </summary>
public sealed class OpenFileLimitTests
{
    // Tern holds about 220-250 files once it serves (its assemblies, sockets, pipes): room for about
    // 190 clients below the reserve, so that 600 fill it and leave the rest in the listen backlog.
    private const int OpenFileLimit = 500;
    private const int Clients = 600;

    [Fact]
    public async Task NearTheFileLimit_AcceptingWaitsWithoutSpinning_IsLoggedOnce_OpenConnectionsAreServed_AndItRecovers()
    {
        await using var upstream = await TestUpstream.StartAsync();
        var (ports, environment) = Settings(upstream);
        environment["Tern__Tls__HandshakeTimeout"] = "00:02:00"; // the held clients never start one
        await using var tern = TernProcess.StartWithOpenFileLimit(OpenFileLimit, environment);
        await tern.WaitUntilServingAsync(ports["Management"]);

        // An HTTP/2 client whose connection is open before the files run out, and a first request
        // through TLS and YARP: what serves it is loaded by then (at the limit, loading an assembly
        // fails).
        using var early = TernInstance.CreateClient(ports["Https"], "https", "localhost", HttpVersion.Version20, null);
        Assert.Equal(HttpStatusCode.OK, (await early.GetAsync(new Uri("/name", UriKind.Relative))).StatusCode);

        var held = new List<Socket>();
        try
        {
            for (var i = 0; i < Clients; i++)
            {
                var socket = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
                held.Add(socket);

                // Completes in the kernel, accepted or not, while the backlog has room (512, or
                // net.core.somaxconn if lower); past that the kernel drops the connection request.
                using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(2));
                try
                {
                    await socket.ConnectAsync(IPAddress.Loopback, ports["Https"], timeout.Token);
                }
                catch (OperationCanceledException)
                {
                    break;
                }
            }

            var failing = await tern.WaitForOutputAsync($"Accepting connections on [::]:{ports["Https"]} fails: fewer than 64 of its {OpenFileLimit} descriptors are left");
            Assert.Contains($"Tern may open {OpenFileLimit} files (RLIMIT_NOFILE", failing, StringComparison.Ordinal);

            // Kestrel's own loop, at the limit itself, tried again at once on both cores (2.95 CPU
            // seconds in these 3 s).
            var before = CpuSeconds(tern.Id);
            await Task.Delay(TimeSpan.FromSeconds(3));
            var used = CpuSeconds(tern.Id) - before;
            Assert.True(used < 1.5, $"Tern used {used:0.00} CPU seconds in 3 s while it could not accept; output:\n{tern.Output}");

            // The connection opened before is served meanwhile, upstream connections included: three
            // requests at once, each held a second by the upstream (which speaks HTTP/1.1), so two
            // need a new upstream connection, from the descriptors kept in reserve.
            var answers = await Task.WhenAll(Enumerable.Range(0, 3).Select(async _ =>
            {
                using var response = await early.GetAsync(new Uri("/slow/1000", UriKind.Relative));
                return (response.StatusCode, Body: await response.Content.ReadAsStringAsync());
            }));
            Assert.All(answers, a => Assert.True(a.StatusCode == HttpStatusCode.OK, $"{a.StatusCode}: {a.Body}"));

            // The management listener may use the reserve: probes and scrapes get through.
            using var management = new HttpClient { Timeout = TimeSpan.FromSeconds(10) };
            Assert.Equal(HttpStatusCode.OK, (await management.GetAsync(new Uri($"http://127.0.0.1:{ports["Management"]}/healthz"))).StatusCode);
            var metrics = await management.GetStringAsync(new Uri($"http://127.0.0.1:{ports["Management"]}/metrics"));
            Assert.Matches($"(?m)^tern_listener_accept_errors_total{{error_type=\"descriptor_reserve\",server_port=\"{ports["Https"]}\"}} [1-9]", metrics);
        }
        finally
        {
            foreach (var socket in held)
            {
                socket.Dispose();
            }
        }

        await tern.WaitForOutputAsync($"Accepting connections on [::]:{ports["Https"]} works again");
        using var late = TernInstance.CreateClient(ports["Https"], "https", "localhost", null, null);
        Assert.Equal(HttpStatusCode.OK, (await late.GetAsync(new Uri("/name", UriKind.Relative))).StatusCode);
        Assert.Equal(HttpStatusCode.OK, (await early.GetAsync(new Uri("/slow/10", UriKind.Relative))).StatusCode);

        var output = tern.Output;
        Assert.Single(output.Split('\n'), line => line.Contains("Accepting connections on", StringComparison.Ordinal) && line.Contains(" fails: ", StringComparison.Ordinal));

        // Nor did the settings poll run out (at the limit itself it took a file it could not open
        // for a change: a failed reload, then a reload of what had not changed).
        Assert.DoesNotContain("Configuration reload", output, StringComparison.Ordinal);
    }

    /// <summary>
    /// Requests that need more upstream connections than the descriptors allow get Tern's own 503,
    /// before the last half of the reserve is gone, so the process and its probes live on. That is
    /// Tern's limit, not the destination's failure: a health check must not count it, or one burst
    /// would take a healthy destination out of the cluster (YARP's passive failure-rate policy
    /// counts every forwarding error, its active one every probe that got no response, and probes
    /// use the same connections).
    /// </summary>
    [Fact]
    public async Task UpstreamConnectionsPastTheReserve_Get503_LeaveTheProcessAndProbesRunning_AndDoNotFailTheDestination()
    {
        await using var upstream = await TestUpstream.StartAsync();
        var (ports, environment) = Settings(upstream);
        environment["ReverseProxy__Clusters__app__HealthCheck__Passive__Enabled"] = "true";
        environment["ReverseProxy__Clusters__app__HealthCheck__Passive__ReactivationPeriod"] = "00:05:00";
        environment["ReverseProxy__Clusters__app__HealthCheck__Active__Enabled"] = "true";
        environment["ReverseProxy__Clusters__app__HealthCheck__Active__Interval"] = "00:00:00.250";
        environment["ReverseProxy__Clusters__app__HealthCheck__Active__Path"] = "/name";
        await using var tern = TernProcess.StartWithOpenFileLimit(OpenFileLimit, environment);
        await tern.WaitUntilServingAsync(ports["Management"]);

        // Six HTTP/2 connections of 100 streams each (Kestrel's limit per connection), every request
        // held a second by the upstream, which speaks HTTP/1.1: 600 upstream connections at once,
        // where Tern has about 250 descriptors free.
        var clients = Enumerable.Range(0, 6).Select(_ => TernInstance.CreateClient(ports["Https"], "https", "localhost", HttpVersion.Version20, null)).ToList();
        try
        {
            foreach (var client in clients)
            {
                Assert.Equal(HttpStatusCode.OK, (await client.GetAsync(new Uri("/name", UriKind.Relative))).StatusCode);
            }

            var answers = await Task.WhenAll(clients.SelectMany(client => Enumerable.Range(0, 100).Select(async _ =>
            {
                using var response = await client.GetAsync(new Uri("/slow/1000", UriKind.Relative));
                return ((int)response.StatusCode, Body: await response.Content.ReadAsStringAsync());
            })));
            var refused = answers.Count(a => a.Item1 == 503);
            Assert.True(refused > 0, "no request ran into the file limit: " + string.Join(", ", answers.GroupBy(a => a.Item1).Select(g => $"{g.Key} x{g.Count()}")));
            Assert.All(answers, a => Assert.True(
                a.Item1 == 200 || a.Body == "503 Service Unavailable: Tern has as many connections open as its open-file limit allows; try again later (cluster 'app')\n",
                $"{a.Item1}: {a.Body}"));

            // The burst is over: the destination is still in the cluster (with one destination
            // YARP would still use it, but /readyz reported the cluster down and the log blamed it).
            using var after = await clients[0].GetAsync(new Uri("/name", UriKind.Relative));
            Assert.True(after.StatusCode == HttpStatusCode.OK, $"{(int)after.StatusCode}: {await after.Content.ReadAsStringAsync()}");
            await Task.Delay(TimeSpan.FromMilliseconds(500));
            Assert.DoesNotContain("Unhealthy", tern.Output, StringComparison.Ordinal); // passive or active

            // The log says which limit was met; .NET's own message names the system's.
            Assert.Contains($"(route default, cluster app, destination d1): fewer than 32 of Tern's {OpenFileLimit} descriptors (RLIMIT_NOFILE) were free, which it keeps for its own threads and files and the management listener, not for upstream connections", tern.Output, StringComparison.Ordinal);
            Assert.DoesNotContain("Too many open files in system", tern.Output, StringComparison.Ordinal);

            // Upstream connections left the last half of the reserve free: the management listener
            // answers, and the runtime, which aborted the process ("Out of memory.") when it could
            // not start a thread, keeps running. Idle upstream connections hold the rest meanwhile.
            using var management = new HttpClient { Timeout = TimeSpan.FromSeconds(5) };
            Assert.Equal(HttpStatusCode.OK, (await management.GetAsync(new Uri($"http://127.0.0.1:{ports["Management"]}/healthz"))).StatusCode);
            Assert.Equal(HttpStatusCode.OK, (await management.GetAsync(new Uri($"http://127.0.0.1:{ports["Management"]}/readyz"))).StatusCode);
            Assert.True(await tern.WaitForExitAsync(TimeSpan.FromSeconds(5)) is null, $"Tern exited:\n{tern.Output}");
            Assert.Equal(HttpStatusCode.OK, (await clients[1].GetAsync(new Uri("/name", UriKind.Relative))).StatusCode);
        }
        finally
        {
            clients.ForEach(c => c.Dispose());
        }
    }

    /// <summary>
    /// Below the least limit Tern can serve with, it stops at once with one line naming the limit.
    /// It used to die on whichever assembly it could not open first, with a stack trace that said
    /// the file was missing.
    /// </summary>
    [Fact]
    public async Task TooLowALimit_StopsStartUpWithOneLineNamingIt()
    {
        var environment = new Dictionary<string, string> { ["Tern__Https__Port"] = FreePort.Next().ToString(CultureInfo.InvariantCulture) };
        await using var tern = TernProcess.StartWithOpenFileLimit(150, environment);
        Assert.Equal(1, await tern.WaitForExitAsync(TimeSpan.FromSeconds(30)));
        Assert.StartsWith("error: Tern may open only 150 files (RLIMIT_NOFILE) and needs at least 400: ", tern.Output, StringComparison.Ordinal);
        Assert.Equal(2, tern.Output.Split('\n', StringSplitOptions.RemoveEmptyEntries).Length);
    }

    /// <summary>Free ports for Tern's listeners, and the environment that sets them and the upstream.</summary>
    private static (Dictionary<string, int> Ports, Dictionary<string, string> Environment) Settings(TestUpstream upstream)
    {
        var ports = new Dictionary<string, int>
        {
            ["Https"] = FreePort.Next(),
            ["Http"] = FreePort.Next(),
            ["Management"] = FreePort.Next(),
        };
        var environment = ports.ToDictionary(p => $"Tern__{p.Key}__Port", p => p.Value.ToString(CultureInfo.InvariantCulture));
        environment["Tern__Demo__Enabled"] = "false";
        environment["ReverseProxy__Clusters__app__Destinations__d1__Address"] = upstream.Address.ToString();
        return (ports, environment);
    }

    /// <summary>User and system CPU seconds the process has used (/proc, in clock ticks of 1/100 s).</summary>
    private static double CpuSeconds(int pid)
    {
        var stat = File.ReadAllText($"/proc/{pid}/stat");
        var fields = stat[(stat.LastIndexOf(')') + 2)..].Split(' ');
        return (long.Parse(fields[11], CultureInfo.InvariantCulture) + long.Parse(fields[12], CultureInfo.InvariantCulture)) / 100.0;
    }
}
