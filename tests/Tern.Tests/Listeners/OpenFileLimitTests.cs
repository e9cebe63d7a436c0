using System.Globalization;
using System.Net;
using System.Net.Sockets;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Listeners;

/// <summary>
/// The real proxy process allowed few open files, and more clients than it may hold: each accepted
/// connection is a file, so accepting fails with EMFILE while clients wait in the backlog.
/// </summary>
public sealed class OpenFileLimitTests
{
    // Tern holds about 250 files once it serves (its assemblies, sockets, pipes): room for about
    // 250 clients, so that 600 fill it and leave the rest in the listen backlog (512).
    private const int OpenFileLimit = 500;
    private const int Clients = 600;

    [Fact]
    public async Task OutOfFiles_AcceptingWaitsWithoutSpinning_IsLoggedOnce_OpenConnectionsAreServed_AndItRecovers()
    {
        await using var upstream = await TestUpstream.StartAsync();
        var ports = new Dictionary<string, int>
        {
            ["Https"] = FreePort.Next(),
            ["Http"] = FreePort.Next(),
            ["Management"] = FreePort.Next(),
        };
        var environment = ports.ToDictionary(p => $"Tern__{p.Key}__Port", p => p.Value.ToString(CultureInfo.InvariantCulture));
        environment["Tern__Demo__Enabled"] = "false";
        environment["ReverseProxy__Clusters__app__Destinations__d1__Address"] = upstream.Address.ToString();
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
                await socket.ConnectAsync(IPAddress.Loopback, ports["Https"]); // completes in the kernel, accepted or not
            }

            var failing = await tern.WaitForOutputAsync($"Accepting connections on [::]:{ports["Https"]} fails: too many open files");
            Assert.Contains($"its limit, RLIMIT_NOFILE, is {OpenFileLimit}", failing, StringComparison.Ordinal);

            // Kestrel's own loop tried again at once, on both cores (5.3 CPU seconds in 5 s).
            var before = CpuSeconds(tern.Id);
            await Task.Delay(TimeSpan.FromSeconds(3));
            var used = CpuSeconds(tern.Id) - before;
            Assert.True(used < 1.5, $"Tern used {used:0.00} CPU seconds in 3 s while it could not accept; output:\n{tern.Output}");

            // The connection opened before is served meanwhile: three requests at once, each held
            // a second by the upstream. One may go over the upstream connection Tern already has;
            // the others need a new one, which Tern cannot open: a 503 saying why, not a hang, and
            // not a 502 blaming the upstream.
            var answers = await Task.WhenAll(Enumerable.Range(0, 3).Select(async _ =>
            {
                using var response = await early.GetAsync(new Uri("/slow/1000", UriKind.Relative));
                return (response.StatusCode, Body: await response.Content.ReadAsStringAsync());
            }));
            Assert.All(answers, a => Assert.True(a.StatusCode is HttpStatusCode.OK or HttpStatusCode.ServiceUnavailable, $"{a.StatusCode}: {a.Body}"));
            var refused = answers.Where(a => a.StatusCode == HttpStatusCode.ServiceUnavailable).ToList();
            Assert.NotEmpty(refused);
            Assert.All(refused, a => Assert.Equal("503 Service Unavailable: Tern has as many connections open as its open-file limit allows; try again later (cluster 'app')\n", a.Body));
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
        Assert.Single(output.Split('\n'), line => line.Contains("fails: too many open files", StringComparison.Ordinal));

        // The settings poll could not read its files either, and once took that for a change:
        // a failed reload, then a reload of what had not changed.
        Assert.DoesNotContain("Configuration reload", output, StringComparison.Ordinal);
    }

    /// <summary>User and system CPU seconds the process has used (/proc, in clock ticks of 1/100 s).</summary>
    private static double CpuSeconds(int pid)
    {
        var stat = File.ReadAllText($"/proc/{pid}/stat");
        var fields = stat[(stat.LastIndexOf(')') + 2)..].Split(' ');
        return (long.Parse(fields[11], CultureInfo.InvariantCulture) + long.Parse(fields[12], CultureInfo.InvariantCulture)) / 100.0;
    }
}
