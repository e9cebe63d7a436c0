using Tern.Tests.Infrastructure;

namespace Tern.Tests.LoadTest;

/// <summary>
/// loadtest/run refuses bad arguments at once, with one line naming the argument, before it builds
/// anything or loads the machine: a mistake found after a 13-minute run would lose the run.
/// </summary>
public class RunnerArgumentTests
{
    public static TheoryData<string, string, int, string> BadArguments() => new()
    {
        { "no rounds", "--repeat|0", 2, "run: error: argument --repeat: '0' is not a whole number of rounds, 1 or more" },
        { "negative rounds", "--repeat|-3", 2, "run: error: argument --repeat: '-3' is not a whole number of rounds, 1 or more" },
        { "rounds not a number", "--repeat|seven", 2, "run: error: argument --repeat: 'seven' is not a whole number of rounds, 1 or more" },
        { "unknown scenario", "--scenarios|h1-1k,h3-1k", 1, "loadtest: unknown h3-1k; choose from h1-1k, " },
        { "unknown server", "--servers|tern-OpenSsl,envoy", 1, "loadtest: unknown envoy; choose from tern-OpenSsl, " },
        { "results folder is a file", "--results|/etc/hostname", 1, "loadtest: --results /etc/hostname: not a folder" },
        { "results folder cannot be made", "--results|/proc/tern-results", 1, "loadtest: --results /proc/tern-results: No such file or directory" },
    };

    [Theory]
    [MemberData(nameof(BadArguments))]
    public async Task BadArgument_ExitsAtOnceNamingIt(string name, string arguments, int exitCode, string expectedLine)
    {
        var (exit, output) = await Tool.RunAsync("python3", [Path.Combine(Repository.Root, "loadtest", "run"), .. arguments.Split('|')], timeoutSeconds: 30);

        Assert.True(exit == exitCode, $"{name}: exit {exit}\n{output}");
        // The line starts so (the lists of scenarios and servers grow).
        Assert.Contains(output.Split('\n'), line => line.StartsWith(expectedLine, StringComparison.Ordinal));
        Assert.DoesNotContain("building Release", output, StringComparison.Ordinal);
    }
}
