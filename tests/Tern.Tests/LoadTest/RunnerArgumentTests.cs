using System.Runtime.Versioning;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.LoadTest;

/// <summary>
/// loadtest/run refuses bad arguments at once, with one line naming the argument, before it builds
/// anything or loads the machine: a mistake found after a 13-minute run would lose the run. The
/// same holds for a tool it needs, gnuplot among them: without it a run used to write no chart and
/// say so only by leaving ", .png" out of its last line.
/// </summary>
public class RunnerArgumentTests
{
    private static readonly string Runner = Path.Combine(Repository.Root, "loadtest", "run");

    // A committed run's CSV: the --chart tests read copies of it.
    private static readonly string CommittedCsv = Path.Combine(Repository.Root, "loadtest", "results", "2026-11-25-2145.csv");

    public static TheoryData<string, string, int, string> BadArguments() => new()
    {
        { "no rounds", "--repeat|0", 2, "run: error: argument --repeat: '0' is not a whole number of rounds, 1 or more" },
        { "negative rounds", "--repeat|-3", 2, "run: error: argument --repeat: '-3' is not a whole number of rounds, 1 or more" },
        { "rounds not a number", "--repeat|seven", 2, "run: error: argument --repeat: 'seven' is not a whole number of rounds, 1 or more" },
        { "unknown scenario", "--scenarios|h1-1k,h3-1k", 1, "loadtest: unknown h3-1k; choose from h1-1k, " },
        { "unknown server", "--servers|tern-OpenSsl,envoy", 1, "loadtest: unknown envoy; choose from tern-OpenSsl, " },
        { "results folder is a file", "--results|/etc/hostname", 1, "loadtest: --results /etc/hostname: not a folder" },
        { "results folder cannot be made", "--results|/proc/tern-results", 1, "loadtest: --results /proc/tern-results: No such file or directory" },
        { "chart of a missing file", "--chart|/nonexistent/run.csv", 1, "loadtest: --chart /nonexistent/run.csv: No such file or directory" },
        { "chart of a file that is not a CSV", "--chart|/etc/hostname", 1, "loadtest: --chart /etc/hostname: not a .csv file" },
    };

    [Theory]
    [MemberData(nameof(BadArguments))]
    public async Task BadArgument_ExitsAtOnceNamingIt(string name, string arguments, int exitCode, string expectedLine)
    {
        var (exit, output) = await Tool.RunAsync("python3", [Runner, .. arguments.Split('|')], timeoutSeconds: 30);

        Assert.True(exit == exitCode, $"{name}: exit {exit}\n{output}");
        // The line starts so (the lists of scenarios and servers grow).
        Assert.Contains(output.Split('\n'), line => line.StartsWith(expectedLine, StringComparison.Ordinal));
        Assert.DoesNotContain("building Release", output, StringComparison.Ordinal);
    }

    [Fact]
    public Task WithoutGnuplot_ARunStopsBeforeBuilding_NamingIt() => InTempFolderAsync("tern-nognuplot-", async bin =>
    {
        // A PATH holding every tool the runner needs that this machine has, but gnuplot.
        foreach (var tool in new[] { "wrk", "h2load", "nginx", "openssl", "cc", "taskset", "dotnet" })
        {
            if (OnPath(tool) is { } found)
            {
                File.CreateSymbolicLink(Path.Combine(bin, tool), found);
            }
        }

        // The interpreter itself: what PATH finds may be a wrapper that needs PATH (pyenv's shims).
        var python = (await Tool.RunAsync("python3", ["-c", "import sys; print(sys.executable)"])).Output.Trim();
        var (exit, output) = await Tool.RunAsync(python, [Runner, "--quick", "--results", Path.Combine(bin, "results")], timeoutSeconds: 30,
            environment: new Dictionary<string, string> { ["PATH"] = bin });

        Assert.True(exit == 1, $"exit {exit}\n{output}");
        var line = Assert.Single(output.Split('\n'), l => l.StartsWith("loadtest: missing ", StringComparison.Ordinal));
        Assert.Contains("gnuplot", line, StringComparison.Ordinal);
        Assert.DoesNotContain("building Release", output, StringComparison.Ordinal);
    });

    [Fact]
    public Task Chart_IsDrawnAgainFromARunsCsv() => InTempFolderAsync("tern-chart-", async folder =>
    {
        // A copy of a committed run's CSV: its chart is drawn beside the copy from the rounds alone.
        var csv = Path.Combine(folder, Path.GetFileName(CommittedCsv));
        File.Copy(CommittedCsv, csv);
        var png = Path.ChangeExtension(csv, ".png");

        var (exit, output) = await Tool.RunAsync("python3", [Runner, "--chart", csv], timeoutSeconds: 30);

        Assert.True(exit == 0, $"exit {exit}\n{output}");
        var drawn = File.ReadAllBytes(png);
        Assert.True(drawn.Length > 2000, $"{drawn.Length} bytes");
        Assert.Equal(new byte[] { 0x89, (byte)'P', (byte)'N', (byte)'G' }, drawn[..4]);
        Assert.Contains($"written {png}", output, StringComparison.Ordinal);
        Assert.DoesNotContain("building Release", output, StringComparison.Ordinal);
        Assert.Equal(new[] { csv, png }, Directory.GetFiles(folder).Order());
    });

    [Fact]
    public Task Chart_OfACsvNoRunWrote_IsOneLine() => InTempFolderAsync("tern-chartbad-", async folder =>
    {
        var committed = File.ReadAllText(CommittedCsv);
        Assert.Contains(",0.0436,", committed, StringComparison.Ordinal);
        var cases = new Dictionary<string, (byte[] Content, string Says)>
        {
            ["binary.csv"] = ([0x89, (byte)'P', (byte)'N', (byte)'G', 0xff, 0xfe, 0x00, 0x81], "'utf-8' codec can't decode byte"),
            ["columns.csv"] = ("name,value\nh1-1k,3\n"u8.ToArray(), "not a run's CSV (it needs the columns round, scenario, server)"),
            // A run's CSV with one figure edited into something that is not a number.
            ["edited.csv"] = (System.Text.Encoding.UTF8.GetBytes(committed.Replace(",0.0436,", ",fast,", StringComparison.Ordinal)), "could not convert string to float: 'fast'"),
        };
        foreach (var (file, (content, says)) in cases)
        {
            var csv = Path.Combine(folder, file);
            File.WriteAllBytes(csv, content);

            var (exit, output) = await Tool.RunAsync("python3", [Runner, "--chart", csv], timeoutSeconds: 30);

            Assert.True(exit == 1, $"{file}: exit {exit}\n{output}");
            var line = Assert.Single(output.Split('\n', StringSplitOptions.RemoveEmptyEntries)); // no traceback
            Assert.StartsWith($"loadtest: --chart {csv}: ", line, StringComparison.Ordinal);
            Assert.Contains(says, line, StringComparison.Ordinal);
            Assert.False(File.Exists(Path.ChangeExtension(csv, ".png")), file);
        }
    });

    [Fact]
    [SupportedOSPlatform("linux")] // the runner, like Tern, runs on Linux
    public Task Chart_GnuplotFailing_SaysSoInOneLine_AndKeepsTheEarlierChart() => InTempFolderAsync("tern-chartfail-", async folder =>
    {
        var csv = Path.Combine(folder, "run.csv");
        File.Copy(CommittedCsv, csv);
        var png = Path.ChangeExtension(csv, ".png");
        File.WriteAllText(png, "the earlier chart");
        var gnuplot = Path.Combine(folder, "gnuplot");
        // It starts the chart (in the file named by "set output '...'"), then fails.
        File.WriteAllText(gnuplot, "#!/bin/sh\nout=$(printf '%s' \"$2\" | sed -n \"s/.*set output '\\([^']*\\)'.*/\\1/p\")\n"
            + "printf 'half a chart' > \"$out\"\necho 'line 0: cannot open font' >&2\nexit 1\n");
        File.SetUnixFileMode(gnuplot, UnixFileMode.UserRead | UnixFileMode.UserExecute);

        var (exit, output) = await Tool.RunAsync("python3", [Runner, "--chart", csv], timeoutSeconds: 30,
            environment: new Dictionary<string, string> { ["PATH"] = folder + ":" + Environment.GetEnvironmentVariable("PATH") });

        Assert.True(exit == 1, $"exit {exit}\n{output}");
        Assert.Equal($"loadtest: gnuplot could not draw {png} (line 0: cannot open font)", output.Trim());
        Assert.Equal("the earlier chart", File.ReadAllText(png));
        Assert.Equal(new[] { gnuplot, csv, png }, Directory.GetFiles(folder).Order()); // the half-drawn one removed
    });

    private static async Task InTempFolderAsync(string prefix, Func<string, Task> test)
    {
        var folder = Directory.CreateTempSubdirectory(prefix).FullName;
        try
        {
            await test(folder);
        }
        finally
        {
            Directory.Delete(folder, recursive: true);
        }
    }

    private static string? OnPath(string tool) =>
        (Environment.GetEnvironmentVariable("PATH") ?? "").Split(':', StringSplitOptions.RemoveEmptyEntries)
            .Select(directory => Path.Combine(directory, tool))
            .FirstOrDefault(File.Exists);
}
