using System.Collections.Concurrent;
using System.Diagnostics;
using System.Runtime.InteropServices;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// The real proxy process (dotnet Tern.Proxy.dll) on the shipped config next to it, configured
/// only through environment variables, as an operator runs it.
/// </summary>
public sealed partial class TernProcess : IAsyncDisposable
{
    private readonly Process _process;
    private readonly ConcurrentQueue<string> _output = new();
    private readonly string _selfSignedFolder;

    private TernProcess(Process process, string selfSignedFolder)
    {
        _process = process;
        _selfSignedFolder = selfSignedFolder;
    }

    public string Output => string.Join('\n', _output);

    public int Id => _process.Id;

    public static TernProcess Start(IDictionary<string, string> environment, params string[] args) => StartFrom(AppContext.BaseDirectory, environment, args);

    /// <summary>
    /// Runs Tern allowed at most openFiles open files (RLIMIT_NOFILE, soft and hard: the runtime
    /// raises the soft limit to the hard one at start). prlimit (util-linux) sets it and then
    /// becomes the process, so <see cref="Id"/> is Tern's.
    /// </summary>
    public static TernProcess StartWithOpenFileLimit(int openFiles, IDictionary<string, string> environment) =>
        StartFrom(AppContext.BaseDirectory, environment, ["prlimit", $"--nofile={openFiles}:{openFiles}", "--", "dotnet"], []);

    /// <summary>
    /// Runs Tern as root without the capabilities that let root read any file (CAP_DAC_OVERRIDE,
    /// CAP_DAC_READ_SEARCH): a file's permissions then bind it as they bind any other user.
    /// </summary>
    public static TernProcess StartWithoutFileOverride(IDictionary<string, string> environment) =>
        StartFrom(AppContext.BaseDirectory, environment, ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", "dotnet"], []);

    /// <summary>Runs the Tern.Proxy.dll found in folder (a copy of the build output, say).</summary>
    public static TernProcess StartFrom(string folder, IDictionary<string, string> environment, params string[] args) => StartFrom(folder, environment, ["dotnet"], args);

    private static TernProcess StartFrom(string folder, IDictionary<string, string> environment, string[] launcher, string[] args)
    {
        var start = new ProcessStartInfo(launcher[0])
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            UseShellExecute = false,
            WorkingDirectory = folder,
        };
        foreach (var part in launcher.Skip(1))
        {
            start.ArgumentList.Add(part);
        }

        start.ArgumentList.Add(Path.Combine(folder, "Tern.Proxy.dll"));
        foreach (var arg in args)
        {
            start.ArgumentList.Add(arg);
        }

        // Only what the test sets: no Tern or YARP settings leak in from the runner's environment, nor
        // the socket switch the test runner sets (tern.runsettings), so that Tern's own default applies.
        foreach (var key in start.Environment.Keys.Where(k => k.StartsWith("Tern__", StringComparison.OrdinalIgnoreCase) || k.StartsWith("ReverseProxy__", StringComparison.OrdinalIgnoreCase) || k is "TERN_CONFIG" or "DOTNET_ENVIRONMENT" or "ASPNETCORE_ENVIRONMENT" or Proxy.Listeners.SocketEventThreads.Variable).ToList())
        {
            start.Environment.Remove(key);
        }

        // A folder of its own: processes starting in parallel would otherwise race to write the
        // same self-signed certificate and key (through the same .tmp names).
        var selfSignedFolder = Directory.CreateTempSubdirectory("tern-test-selfsigned-").FullName;
        start.Environment["Tern__Tls__SelfSignedDirectory"] = selfSignedFolder;
        foreach (var (key, value) in environment)
        {
            start.Environment[key] = value;
        }

        var process = new TernProcess(Process.Start(start)!, selfSignedFolder);
        process._process.OutputDataReceived += (_, e) => { if (e.Data is not null) { process._output.Enqueue(e.Data); } };
        process._process.ErrorDataReceived += (_, e) => { if (e.Data is not null) { process._output.Enqueue(e.Data); } };
        process._process.BeginOutputReadLine();
        process._process.BeginErrorReadLine();
        return process;
    }

    /// <summary>Waits for the process to exit; returns its exit code, or null if it is still running.</summary>
    public async Task<int?> WaitForExitAsync(TimeSpan timeout)
    {
        using var cts = new CancellationTokenSource(timeout);
        try
        {
            await _process.WaitForExitAsync(cts.Token);
            _process.WaitForExit(); // drains the redirected output
            return _process.ExitCode;
        }
        catch (OperationCanceledException)
        {
            return null;
        }
    }

    /// <summary>Waits until /healthz answers on the management port, or fails with the process output.</summary>
    public async Task WaitUntilServingAsync(int managementPort, TimeSpan? timeout = null)
    {
        using var client = new HttpClient { Timeout = TimeSpan.FromSeconds(2) };
        var deadline = DateTime.UtcNow + (timeout ?? TimeSpan.FromSeconds(30));
        while (DateTime.UtcNow < deadline)
        {
            if (_process.HasExited)
            {
                throw new InvalidOperationException($"Tern exited with {_process.ExitCode}:\n{Output}");
            }

            try
            {
                var response = await client.GetAsync(new Uri($"http://127.0.0.1:{managementPort}/healthz"));
                if (response.IsSuccessStatusCode)
                {
                    return;
                }
            }
            catch (HttpRequestException)
            {
            }
            catch (TaskCanceledException)
            {
            }

            await Task.Delay(100);
        }

        throw new TimeoutException($"Tern did not serve /healthz on {managementPort}:\n{Output}");
    }

    /// <summary>
    /// Waits until a line of output contains text; returns the line, or fails with the output.
    /// The console logger writes asynchronously: a line can arrive after what it reports took effect.
    /// </summary>
    public Task<string> WaitForOutputAsync(string text, TimeSpan? timeout = null) =>
        LineWait.WaitForAsync(_output, text, timeout, () => $"no output line contains '{text}'; output:\n{Output}");

    /// <summary>Sends SIGTERM, as Kubernetes does to stop a pod.</summary>
    public void Terminate() => _ = Kill(_process.Id, 15);

    public async ValueTask DisposeAsync()
    {
        if (!_process.HasExited)
        {
            _process.Kill(entireProcessTree: true);
            await _process.WaitForExitAsync();
        }

        _process.Dispose();
        Directory.Delete(_selfSignedFolder, recursive: true);
    }

    [LibraryImport("libc", EntryPoint = "kill")]
    private static partial int Kill(int pid, int signal);
}
